"""Walking a traced program, for tests that check what was traced (a loop, a remat, a kernel)."""
import jax
import jax.extend


def all_eqns(jaxpr):
    """Every equation of a jaxpr, those of the jaxprs inside its equations (jit, scan, remat,
    shard_map, custom rules) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from all_eqns(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from all_eqns(sub)
