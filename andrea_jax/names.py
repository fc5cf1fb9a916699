"""The names that the config, the model, the kernels, train and serve share, each defined once below
all of them: the device mesh's axes, the logical axis names of the model's arrays and the rules that
map them onto the mesh, the kernel implementations, the model families and the ProRes schedules.
Plain data that imports nothing, so the config validates its settings against these names without
importing jax.
"""
MESH_AXES = ("data", "fsdp", "tensor")  # the device mesh's axes (andrea_jax.mesh makes the mesh)

# Logical axis names of the model's arrays (andrea_jax.model.layers names every parameter and the
# key activations with them; only RULES below maps them to mesh axes):
#   batch, seq: an activation's rows and positions    act_embed: the residual stream's width D
#   embed: a matrix's D dimension                     heads: attention's D as H heads x K
#   qkv: the fused [q|k|v] columns (3D)               mlp: the MLP's hidden width F
#   vocab: the tied embedding's rows                  layers: the scan's stacked layer axis
LOGICAL_AXES = ("batch", "seq", "act_embed", "embed", "heads", "qkv", "mlp", "vocab", "layers")

# logical name -> the mesh axes that split it (None: whole on every device); `mesh.rules` in the
# config overrides it (andrea_jax.mesh.rules). Order matters only where one array has two names
# that want the same mesh axis: the earlier rule wins.
RULES: tuple[tuple[str, tuple[str, ...] | str | None], ...] = (
    ("batch", ("data", "fsdp")),  # activations' rows: every data-parallel device takes its own
    ("seq", None),                # positions: no sequence parallelism
    ("act_embed", None),          # the residual stream's width: whole, LayerNorm reduces over it
    ("embed", "fsdp"),            # a matrix's d_model dimension: FSDP shards the state along it
    ("heads", "tensor"),          # attention heads (the rows of the output projection)
    # The fused [q|k|v] columns stay whole on each tensor shard: split contiguously they would
    # not line up with the heads (a shard would hold all of q and part of k), so every shard
    # slices its own heads out of them, which costs no communication. FSDP still shards them.
    ("qkv", None),
    ("mlp", "tensor"),            # the MLP's hidden width
    ("vocab", "tensor"),          # the tied embedding's rows and the logits (whole when not divisible)
    ("layers", None),             # the scanned layer axis: each device holds every layer's slice
)
# Logical names whose size a mesh may fail to divide without being refused: the dimension is then
# left whole. The vocabulary (8449 = 7 x 17 x 71) cannot be padded without changing checkpoints.
WHOLE_IF_NOT_DIVISIBLE = ("vocab",)

# kernels.impl: the backends of andrea_jax.kernels (kernels/src/__init__.py says what each is)
KERNEL_IMPLS = ("auto", "xla", "pallas", "triton")

# model.family: each is the module andrea_jax/model/<name>.py, which andrea_jax.model.transformer.FAMILIES
# loads by this name (a new family is its module and its name here)
FAMILIES = ("gpt2", "llama")

# prores.schedule: the ProRes paper's Table 5; andrea_jax.model.prores.SCHEDULES holds their formulas
SCHEDULES = ("none", "linear", "linear_sqrt", "linear_square", "equal", "reverse",
             "stagewise_0", "stagewise_L", "stagewise_sqrt_L", "stagewise_sqrt_l",
             "fix_L", "fix_sqrt_L", "fix_sqrt_l")
