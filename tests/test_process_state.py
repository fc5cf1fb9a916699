"""The commands leave the process as they found it: a library user who calls generate's main (or
the closing sample) keeps their own warning hooks."""
import warnings

from andrea_jax.serve import generate


def test_generate_main_restores_the_warning_hooks(trained_run, capsys):
    def mine(message, *args, **kwargs):
        pass

    saved = warnings.showwarning, warnings.formatwarning
    warnings.showwarning = mine
    try:
        # max_new_tokens beyond the context warns, through the command's own hook
        assert generate.main(["--workdir", str(trained_run()), "--prompt", "To be", "--max-new-tokens", "40",
                              "--temperature", "0"]) == 0
        assert "warning: max_new_tokens=40" in capsys.readouterr().err
        assert warnings.showwarning is mine
        assert warnings.formatwarning is saved[1]
    finally:
        warnings.showwarning = saved[0]
