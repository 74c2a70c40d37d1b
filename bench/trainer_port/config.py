"""The resolved config (`distill_trainer --print-config`) as nested dicts."""
from __future__ import annotations

import re

import yaml


class _Loader(yaml.SafeLoader):
    pass


# The trainer prints numbers as fmt does ("1e-08", "0.0006"); YAML 1.1 reads an exponent
# without a dot as a string, so floats get a resolver that takes both.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def parse_config(text: str) -> dict:
    return yaml.load(text, Loader=_Loader)
