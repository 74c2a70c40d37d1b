"""Finds and loads liblossfns.so, whose static initialisers register torch.ops.lossfns.*.

The library is the one shipped in this package (beside this file), or the one named by the
environment variable LOSSFNS_LIBRARY (a build tree's lib/liblossfns.so: how the tests and a
developer use the package straight from python/ without installing it).
"""
from __future__ import annotations

import ctypes
import os

import torch

LIBRARY_ENV = "LOSSFNS_LIBRARY"


def library_path() -> str:
    """The path of the liblossfns.so this package loads (not necessarily loaded yet)."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return os.path.abspath(override)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "liblossfns.so")


def load() -> str:
    """Loads the library into the process once (torch.ops.load_library keeps it loaded) and
    returns its path. libtorch and libc10 are already in the process (`import torch`), which is
    how the library finds them wherever torch is installed."""
    path = library_path()
    if not os.path.isfile(path):
        where = f"${LIBRARY_ENV}={path}" if os.environ.get(LIBRARY_ENV) else path
        raise ImportError(
            f"lossfns: no library at {where}. Install the package with "
            "`pip install --no-build-isolation .` from the lossfns source tree, or point "
            f"{LIBRARY_ENV} at a built liblossfns.so")
    # A second copy of the library (a build tree's, loaded with torch.ops.load_library, and this
    # package's) would register every op again: C++ static initialisers that throw, which aborts
    # the process. The same file again is a no-op; another one is refused here, by name.
    real = os.path.realpath(path)
    loaded = sorted(os.path.realpath(p) for p in torch.ops.loaded_libraries)
    if real in loaded:
        return path
    if real in _mapped_files():  # the same file, mapped another way (ctypes, a C++ extension)
        torch.ops.load_library(path)  # dlopen returns that handle: nothing registers again
        return path
    if _ops_registered():
        by = ", ".join(loaded) if loaded else "a library not loaded with torch.ops.load_library"
        raise ImportError(
            f"lossfns: torch.ops.lossfns is already registered in this process (by {by}); this "
            f"package would load another copy, {path}, whose registrations would abort the process. "
            "Load one copy: use `import lossfns` alone, or point "
            f"{LIBRARY_ENV} at the library already loaded")
    torch.ops.load_library(path)
    return path


def _mapped_files() -> set:
    """The real paths of the files mapped into this process (Linux /proc/self/maps; else none)."""
    try:
        with open("/proc/self/maps") as maps:
            return {os.path.realpath(line.split(None, 5)[5].strip()) for line in maps
                    if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/")}
    except OSError:
        return set()


def _ops_registered() -> bool:
    try:
        torch.ops.lossfns.tvd_loss
    except (AttributeError, RuntimeError):
        return False
    return True


def library_version(path: str) -> str:
    """lossfns::version() of the loaded library (the CMake project version). The C++ function's
    Itanium-mangled name: it has no C alias, and the dispatcher has no op for it."""
    fn = ctypes.CDLL(path)._ZN7lossfns7versionEv  # the handle torch.ops.load_library opened
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode()
