"""Runs argv[1:] with SIGINT ignored, as `cmd &` in a script, nohup-like wrappers and some
schedulers start a program: the ignored disposition survives exec, so the program inherits it."""
import os
import signal
import sys

signal.signal(signal.SIGINT, signal.SIG_IGN)
os.execv(sys.argv[1], sys.argv[1:])
