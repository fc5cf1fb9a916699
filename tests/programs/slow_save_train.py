"""train.py's command line with a checkpoint save that takes 10 minutes: a signal that comes while
it runs can only be answered by stopping at once (tests/test_resume.py, scripts/stress_signals.py)."""
import sys
import time

from andrea_jax import checkpoint, cli


def slow_save(*args, **kwargs):
    print("slow save started", flush=True)
    time.sleep(600)


checkpoint.save = slow_save
sys.exit(cli.main(sys.argv[1:]))
