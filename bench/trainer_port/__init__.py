"""A PyTorch port of distill_trainer's models and optimizer step, for bench/trainer_bench.py."""
