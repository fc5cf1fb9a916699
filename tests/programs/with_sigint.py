"""Runs argv[2:] with SIGINT's disposition set to argv[1], whatever this process inherited (the
disposition survives exec): `ignore`, as `cmd &` in a script, nohup-like wrappers and some
schedulers start a program; `default`, as a terminal does."""
import os
import signal
import sys

signal.signal(signal.SIGINT, {"ignore": signal.SIG_IGN, "default": signal.SIG_DFL}[sys.argv[1]])
os.execv(sys.argv[2], sys.argv[2:])
