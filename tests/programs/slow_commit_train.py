"""train.py's command line whose checkpoints from step ANDREA_SLOW_COMMIT_FROM on take 10 minutes
to commit: orbax has written the step's files into its temporary folder and waits, in its
background thread, before the rename that makes the checkpoint complete (tests/test_resume.py
kills the run there)."""
import asyncio
import os
import sys

from orbax.checkpoint._src.path import atomicity

from andrea_jax import cli

SLOW_FROM = int(os.environ["ANDREA_SLOW_COMMIT_FROM"])
commit = atomicity.AtomicRenameTemporaryPath.finalize


async def slow_commit(self):
    final = self._final_path.name
    if final.isdigit() and int(final) >= SLOW_FROM:
        print(f"slow commit of checkpoint {final} started", flush=True)
        await asyncio.sleep(600)
    await commit(self)


atomicity.AtomicRenameTemporaryPath.finalize = slow_commit
sys.exit(cli.main(sys.argv[1:]))
