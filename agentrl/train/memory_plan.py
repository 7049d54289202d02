"""How much accelerator memory a training step and an engine need: a pure function of the model's
config, the parallel layout, the precision, activation checkpointing and the micro-batch size.

No torch import, no device: ``agentrl train --dry-run`` prints it per device before anything starts,
and the pre-flight refuses a plan over the device's capacity, naming the largest term and the
setting that shrinks it. Figures are bytes per device.

**Trainer rank** (:func:`plan_trainer_memory`), for dense decoder models (Qwen3, Qwen2, Llama,
Mistral shapes; ``N`` parameters, ``b`` bytes per compute element):

- *weights*: the compute copy (``b·N``; float32 for a sharded model with master weights, whose
  shards *are* the masters; under FSDP the gathered layers in flight and the root's embedding);
- *gradients*: float32 with master weights (``4N``), else the weights' dtype; all of them, since a
  step accumulates over several micro-batches;
- *master weights* (``4N``) and *optimizer state* (Adam's two moments, ``8N`` in float32): divided
  by the data-parallel size when sharded (FSDP, Megatron's distributed optimizer), on the host with
  ``optimizer_offload``;
- *activations* at ``micro_batch_tokens`` per layer and token, itemised from the modelling code
  (Hugging Face's for the torch backend: float32 norms, q/k norms, RoPE, the attention's inputs and
  output, SwiGLU's gate, up and product), with and without checkpointing; with checkpointing, one
  layer recomputed during its backward pass;
- *logits working set*: with the fused head a few ``[chunk, vocab]`` float32 buffers and the
  output embedding's float32 gradient accumulator; without it the ``[tokens, vocab]`` logits and
  their gradient in the compute dtype;
- *attention scores*: zero for packed per-document attention; ``[S, S]`` (mask, or Megatron's
  ``[heads, S, S]`` scores) for dense attention.

**LoRA** (``TrainerSetup.lora``, torch backend, unsharded): the base is frozen and replicated, so
*weights* are the base in the compute dtype plus the adapter; *gradients* and *optimizer state*
are the adapter's alone, ``rank · (in + out)`` parameters per targeted linear layer, in float32 for
a bfloat16/float16 model (peft keeps adapters in float32, so there are no *master weights*); there
is no *reference weights* copy (the KL reference is the base with the adapter disabled). The
activations change both ways: a frozen linear layer keeps no input for a weight gradient (nor do
the frozen norms, nor the frozen output head, which gets no float32 gradient accumulator), but
each targeted layer casts its input to the adapter's float32 and keeps that copy for ``A``'s
gradient (``4 · in`` bytes per token, per targeted layer: q, k and v each keep their own), plus
``A``'s ``[tokens, rank]`` output, which is small: the casts outweigh it by ``in / rank``. So without
checkpointing a LoRA layer keeps *more* per token than a fully trained one (Qwen3-8B: 297 kB against
215 kB); with full checkpointing every layer keeps its input either way and the casts exist only in
the layer being recomputed. With ``dropout > 0`` each targeted layer also keeps its dropped-out input
and the mask. The backward pass of a layer holds the float32 gradient of ``down_proj``'s input.

The peak is the resident terms plus the largest of: the head's backward pass on top of all
activations, a layer's recomputation and backward pass, and (unfused AdamW) the optimizer's
per-parameter temporaries. The torch backend's figures, LoRA's included, are checked against
PyTorch's ``MemTracker`` on fake tensors (``bench/bench_memory.py``); the Megatron figures follow the
same itemisation for its local layer spec and are not measured.

**Engine** (:func:`engine_kv_tokens`): SGLang's static pool is ``mem_fraction_static`` of the
device; what the weights (and, serving LoRA, the adapter slots of :func:`engine_adapter_bytes`)
leave of it holds the KV cache, ``2 · layers · kv_heads/TP · head_dim · b`` bytes per token.

**Mixtures of experts** (``qwen3_moe``, every layer sparse): a layer's MLP is ``E`` experts of
``I`` behind a router, each token sent to ``k`` of them. *Weights*: the torch backend holds every
expert; Megatron splits the experts over ``expert_parallel`` ranks (and the pipeline stages) while
the rest (attention, norms, routers, embeddings) splits over TP × PP as for a dense model, and its
distributed optimizer shards the dense part over the data-parallel ranks and the experts over the
expert-data-parallel ones (``DP·TP / EP``). *Activations*: instead of the dense MLP's, each token's
``k`` dispatched copies keep the expert's input and output (``2H``), ``gate|up`` (``2I``), SiLU(gate)
and the product (``I`` each) in the compute dtype, the router's float32 softmax over ``E`` and the
sort/gather indices; Megatron's all-to-all dispatcher keeps one more permuted copy per token (``H``)
before the exchange. Routing is assumed balanced (each rank receives ``k·T`` rows on average; a
skewed router raises the most loaded rank's share). *Routing storage*: a micro-batch carries the
routed-experts channel, ``layers × k`` bytes per token (two above 256 experts) and a presence flag
(:meth:`ModelShape.routing_bytes_per_token`); a trajectory stores the same per token on the host.
The torch backend's MoE figures are checked against ``MemTracker`` on fake tensors with
transformers' grouped-GEMM experts (``bench/bench_moe_plan.py``; its eager experts call ``nonzero``,
which fake tensors refuse).

Architectures outside these shapes (hybrid linear attention such as Qwen3.5's Gated DeltaNet
layers, other mixtures of experts, vision-language towers) raise :class:`UnmodelledModel`: the
planner says so instead of printing wrong numbers.

Example::

    shape = ModelShape.from_config(json.load(open("models/Qwen3-4B/config.json")))
    memory = plan_trainer_memory(shape, TrainerSetup(data_parallel=4, sharded=True,
                                                     activation_checkpointing="full", micro_batch_tokens=32768))
    print(memory.peak / GIB)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.train.config import LoraSettings

__all__ = ["GIB", "ModelShape", "TrainerMemory", "TrainerSetup", "UnmodelledModel", "activation_bytes_per_token",
           "engine_adapter_bytes", "engine_kv_tokens", "engine_weight_bytes", "plan_trainer_memory"]

GIB = 1 << 30
_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
_DENSE_TYPES = ("qwen3", "qwen2", "llama", "mistral")
_MOE_TYPES = ("qwen3_moe",)


class UnmodelledModel(ValueError):
    """The planner has no memory model for this architecture (the message says why)."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer (from a Hugging Face ``config.json``): dense, or with
    ``experts`` experts of ``expert_ffn`` per layer, ``top_k`` per token (``ffn`` unused then)."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool
    experts: int = 0
    expert_ffn: int = 0
    top_k: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """Read a ``config.json`` dict; :class:`UnmodelledModel` for an architecture outside the model."""
        model_type = str(config.get("model_type", "?"))
        layer_types = set(config.get("layer_types") or ())
        text = config.get("text_config")
        if isinstance(text, Mapping):
            layer_types |= set(text.get("layer_types") or ())
        if layer_types - {"full_attention", "sliding_attention"}:
            raise UnmodelledModel(f"model_type={model_type!r} has layer types {sorted(layer_types)} (hybrid linear "
                                  "attention): the memory planner models dense attention layers only")
        if isinstance(text, Mapping):
            raise UnmodelledModel(f"model_type={model_type!r} nests its language model under text_config (a "
                                  "vision-language model): the memory planner models text-only decoders")
        experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
        if experts and model_type not in _MOE_TYPES:
            raise UnmodelledModel(f"model_type={model_type!r} is a mixture of experts ({experts} experts): the "
                                  f"memory planner models the mixtures of experts {list(_MOE_TYPES)} only")
        if experts and (config.get("mlp_only_layers") or int(config.get("decoder_sparse_step") or 1) != 1):
            raise UnmodelledModel(f"model_type={model_type!r} has dense layers between its sparse ones "
                                  "(mlp_only_layers, decoder_sparse_step): the memory planner models all-sparse ones")
        if not experts and model_type not in _DENSE_TYPES:
            raise UnmodelledModel(f"model_type={model_type!r}: the memory planner models {list(_DENSE_TYPES)} "
                                  f"and {list(_MOE_TYPES)}")
        try:
            moe = {"experts": int(experts), "expert_ffn": int(config["moe_intermediate_size"]),
                   "top_k": int(config["num_experts_per_tok"])} if experts else {}
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(model_type=model_type, vocab=int(config["vocab_size"]), hidden=hidden,
                       layers=int(config["num_hidden_layers"]), heads=heads,
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or hidden // heads),
                       ffn=int(config.get("intermediate_size") or 0) if experts else int(config["intermediate_size"]),
                       tied=bool(config.get("tie_word_embeddings", False)), **moe)
        except (KeyError, TypeError, ValueError) as exc:
            raise UnmodelledModel(f"config.json: cannot read the model's sizes ({type(exc).__name__}: {exc})") from None

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * self.hidden * q + 2 * self.hidden * kv + 2 * self.hidden + 2 * self.head_dim
        if self.is_moe:  # the router and every expert
            return attention + self.experts * self.hidden + self.experts * 3 * self.hidden * self.expert_ffn
        return attention + 3 * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """The experts' parameters over all layers (what expert parallelism splits); 0 for a dense model."""
        return self.layers * self.experts * 3 * self.hidden * self.expert_ffn

    @property
    def active_params(self) -> int:
        """Parameters a token passes through (its ``top_k`` experts of each layer)."""
        if not self.is_moe:
            return self.params
        return self.params - self.expert_params + self.layers * self.top_k * 3 * self.hidden * self.expert_ffn

    def routing_bytes_per_token(self) -> int:
        """The routed-experts channel of one token: ``layers × top_k`` expert ids, one byte each up to 256
        experts (two beyond); 0 for a dense model."""
        if not self.is_moe:
            return 0
        return self.layers * self.top_k * (1 if self.experts <= 256 else 2)

    @property
    def embedding_params(self) -> int:
        """The input embedding, plus the output embedding when it is not tied."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        return self.embedding_params + self.layers * self.layer_params + self.hidden

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's linear layers by module name: ``(in_features, out_features)``."""
        q, kv, h, ffn = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.ffn
        attention = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        if self.is_moe:  # the experts are not linear layers of their own (stacked per layer)
            return attention
        return {**attention, "gate_proj": (h, ffn), "up_proj": (h, ffn), "down_proj": (ffn, h)}

    def lora_targets(self, lora: LoraSettings) -> dict[str, tuple[int, int]]:
        """The targeted linear layers of one decoder layer; :class:`UnmodelledModel` for a target
        outside them (the embeddings or the output head, say)."""
        dims = self.linear_dims()
        unknown = [m for m in lora.target_modules if m not in dims]
        if unknown:
            raise UnmodelledModel(f"train.lora.target_modules={list(lora.target_modules)}: the memory planner models "
                                  f"adapters on {list(dims)} only, not {unknown}")
        return {m: dims[m] for m in lora.target_modules}

    def lora_params(self, lora: LoraSettings) -> int:
        """The adapter's parameters: ``rank · (in + out)`` per targeted linear layer, in every layer."""
        return self.layers * sum(lora.rank * (i + o) for i, o in self.lora_targets(lora).values())

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """Key and value bytes per token on one engine rank (KV heads are split, or replicated past TP = heads)."""
        kv_per_rank = max(self.kv_heads // tensor_parallel, 1)
        return 2 * self.layers * kv_per_rank * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class TrainerSetup:
    """What a trainer rank's memory depends on besides the model (see the module doc).

    ``sharded``: FSDP (torch backend); ``distributed_optimizer``: Megatron's. ``attention``:
    ``"packed"`` (per-document kernels, ``kernel_copies_output`` when the CPU per-document path keeps a
    second copy of the attention output) or ``"dense"``. ``micro_batches``: per step and rank; with two
    or more the gradients are complete while the last micro-batch's activations are alive.
    ``fused_optimizer``: AdamW's fused kernel (CUDA), without per-parameter temporaries.
    ``lora``: a LoRA adapter trains on the frozen base (torch backend, unsharded; see the module doc).
    ``teacher_params``: a distillation teacher the trainer holds (``teacher.kind = "model"``), frozen in
    the compute dtype on every rank, like an unsharded reference model.
    ``expert_parallel``: Megatron ranks sharing a MoE model's experts (a divisor of ``data_parallel``).
    """

    backend: Literal["torch", "megatron"] = "torch"
    dtype: str = "bfloat16"
    master_weights: bool = True
    data_parallel: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sharded: bool = False
    distributed_optimizer: bool = True
    optimizer_offload: bool = False
    activation_checkpointing: str = "none"
    micro_batch_tokens: int = 8192
    attention: Literal["packed", "dense"] = "packed"
    kernel_copies_output: bool = False
    fused_lm_head: bool = True
    logprob_chunk_size: int = 128
    reference_model: bool = False
    fused_optimizer: bool = True
    micro_batches: int = 2
    lora: LoraSettings | None = None
    teacher_params: int = 0
    expert_parallel: int = 1

    def __post_init__(self) -> None:
        if self.lora is not None and (self.backend != "torch" or self.sharded):
            raise ValueError(f"lora: a LoRA adapter trains on the unsharded torch backend, got backend="
                             f"{self.backend!r}, sharded={self.sharded}")
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype: expected one of {sorted(_DTYPE_BYTES)}, got {self.dtype!r}")
        if self.activation_checkpointing not in ("none", "full", "selective"):
            raise ValueError(f"activation_checkpointing: expected 'none', 'full' or 'selective', got "
                             f"{self.activation_checkpointing!r}")
        for name in ("data_parallel", "tensor_parallel", "pipeline_parallel", "micro_batch_tokens",
                     "logprob_chunk_size", "micro_batches", "expert_parallel"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")

    @property
    def compute_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def uses_masters(self) -> bool:
        return self.master_weights and self.compute_bytes < 4 and self.lora is None

    @property
    def adapter_bytes(self) -> int:
        """Bytes per adapter element: float32 under a half-precision model (peft upcasts the adapter)."""
        return max(self.compute_bytes, 4)


@dataclass
class TrainerMemory:
    """One trainer rank's memory: the named ``terms`` (bytes; what the dry run prints), the
    activations at the configured tokens under each checkpointing mode, the ``peak`` of a step, and
    ``resident`` — what stays on the device between steps once the optimizer state is offloaded
    (colocated engines have the rest); ``adapter_params``: the LoRA adapter's parameters (0 without
    LoRA)."""

    terms: dict[str, int]
    activations_by_mode: dict[str, int]
    peak: int
    resident: int
    notes: list[str] = field(default_factory=list)
    adapter_params: int = 0

    @property
    def largest(self) -> str:
        return max(self.terms, key=lambda k: self.terms[k])


def activation_bytes_per_token(shape: ModelShape, setup: TrainerSetup) -> dict[str, int]:
    """Bytes one decoder layer keeps per token for its backward pass, under each checkpointing
    mode: ``"none"``, ``"selective"`` (the MLP recomputed) and ``"full"`` (the layer's input only).
    Per tensor-parallel rank for Megatron (heads and MLP split, hidden-sized tensors replicated)."""
    b, h = setup.compute_bytes, shape.hidden
    tp = setup.tensor_parallel if setup.backend == "megatron" else 1
    q, kv, ffn, heads = (shape.heads * shape.head_dim // tp, max(shape.kv_heads // tp, 1) * shape.head_dim,
                         shape.ffn // tp, shape.heads // tp)
    norm = 4 * h + 2 * b * h + 4  # the float32 input (squared, normalised), the rounded norm, the output
    qk_norm = (4 + b) * (q + kv) + 4 * (heads + max(shape.kv_heads // tp, 1))  # float32 q, k; rounded; rsqrt
    rope = b * (q + kv)  # the rotated q and k (the attention's inputs; cos and sin are shared)
    attention = b * kv + b * q * (2 if setup.kernel_copies_output else 1) + 4 * heads  # v, output, log-sum-exp
    mlp = 4 * b * ffn  # gate, SiLU(gate), up, their product
    if shape.is_moe:
        mlp = _expert_activation_bytes_per_token(shape, setup)
    if setup.lora is not None:  # (a frozen o_proj keeps no copy of the attention's output)
        return _lora_activation_bytes_per_token(shape, setup, setup.lora, rope + b * kv + b * q + 4 * heads)
    full_layer = 2 * norm + qk_norm + rope + attention + mlp + 8  # + the position ids
    return {"none": full_layer, "selective": full_layer - mlp, "full": b * h}


def _expert_activation_bytes_per_token(shape: ModelShape, setup: TrainerSetup) -> int:
    """A MoE layer's MLP activations per token (see the module doc): ``k`` dispatched copies of the
    expert's input and output, ``gate|up``, SiLU(gate) and the product, their gate weight and sort/gather
    indices (int64), the router's float32 softmax; with Megatron the dispatcher's permuted copy."""
    b, h, k, f = setup.compute_bytes, shape.hidden, shape.top_k, shape.expert_ffn
    per_copy = b * (2 * h + 4 * f) + 4 + 3 * 8
    dispatcher = k * b * h if setup.backend == "megatron" else 0
    return k * per_copy + 4 * shape.experts + dispatcher


def _lora_activation_bytes_per_token(shape: ModelShape, setup: TrainerSetup, lora: LoraSettings,
                                     attention: int) -> dict[str, int]:
    """:func:`activation_bytes_per_token` on a frozen base with adapters (see the module doc): the
    frozen norms keep their float32 input and ``rsqrt`` only, the q/k norms their float32 input, the
    MLP its gate, SiLU(gate) and up (the product feeds a frozen ``down_proj``), and each targeted
    layer its input in the adapter's dtype (a copy per layer under a half-precision model; the input
    itself otherwise, once per distinct input) and ``A``'s output. ``attention``: RoPE's outputs and
    the attention's tensors, as without LoRA. (Tallied from the tensors autograd saves for a LoRA
    step of the torch backend, tensor by tensor.)"""
    b, h, a = setup.compute_bytes, shape.hidden, setup.adapter_bytes
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    norm = 4 * h + 4
    qk_norm = 4 * (q + kv) + 4 * (shape.heads + shape.kv_heads)
    targets = shape.lora_targets(lora)
    inputs = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "o_proj": "o", "gate_proj": "mlp",
              "up_proj": "mlp", "down_proj": "down"}
    if lora.dropout > 0:  # each targeted layer keeps its own dropped-out input and the dropout's mask (in the
        # input's dtype as on CPU: an upper bound for CUDA's fused kernel, whose mask is one byte per element)
        kept = {m: 2 * a * i + a * lora.rank for m, (i, _) in targets.items()}
    elif a > b:  # each targeted layer casts its input to the adapter's dtype
        kept = {m: a * i + a * lora.rank for m, (i, _) in targets.items()}
    else:  # the input itself, once for the layers that read it (q, k and v; gate and up)
        kept = {m: a * lora.rank for m in targets}
        seen = set()
        for m, (i, _) in targets.items():
            if inputs[m] not in seen:
                kept[m] += b * i
                seen.add(inputs[m])
    mlp_targets = sum(kept.get(m, 0) for m in ("gate_proj", "up_proj", "down_proj"))
    mlp = 3 * b * shape.ffn + mlp_targets
    full_layer = 2 * norm + qk_norm + attention + sum(kept.values()) + 3 * b * shape.ffn + 8
    # selective: the MLP keeps its input (which nothing else keeps on a frozen base) instead
    return {"none": full_layer, "selective": full_layer - mlp + b * h, "full": b * h}


def _head_bytes(shape: ModelShape, setup: TrainerSetup) -> tuple[int, int, int]:
    """(kept for the backward pass, forward working set, backward working set) of the output head."""
    s, b, v, h, c = setup.micro_batch_tokens, setup.compute_bytes, shape.vocab, shape.hidden, setup.logprob_chunk_size
    tp = setup.tensor_parallel if setup.backend == "megatron" else 1
    rows = -(-v // tp)
    kept = s * (4 * h + 2 * b * h + 64)  # the final norm (as a layer norm) + per-token scalars of the loss
    if setup.lora is not None:  # a frozen norm keeps no rounded copy for its weight's gradient
        kept -= s * b * h
    if setup.fused_lm_head:
        forward = 2 * c * rows * 4
        # the float32 accumulator, then its cast to the weight's dtype (none for a frozen head)
        grad_w = 0 if setup.lora is not None else rows * h * (4 + b)
        backward = grad_w + 3 * c * rows * 4 + s * b * h
        return kept, forward, backward
    logits = s * rows * b
    return kept + logits, 2 * c * rows * 4, logits + 2 * c * rows * 4


def _layer_backward_bytes_per_token(shape: ModelShape, setup: TrainerSetup) -> int:
    """The gradients in flight while a layer's backward pass runs (on top of its activations). With
    LoRA the largest is the gradient of ``down_proj``'s input through the adapter, in the adapter's
    dtype, while the base's and the saved input are still alive (the planned peaks are within 6% of
    MemTracker's on the shapes of the tests and the bench)."""
    b, h = setup.compute_bytes, shape.hidden
    if shape.is_moe and setup.lora is None:  # per dispatched copy: gate|up's, the product's and the output's
        return shape.top_k * b * (3 * shape.expert_ffn + 2 * h) + 4 * b * h
    if setup.lora is None:
        tp = setup.tensor_parallel if setup.backend == "megatron" else 1
        return 3 * b * shape.ffn // tp + 4 * b * h
    a = setup.adapter_bytes
    if a > b:  # the float32 gradient of down_proj's input through the adapter, hidden-sized gradients
        return a * shape.ffn + (a + b) * h
    return (a + b) * shape.ffn  # down_proj's input gradients through the base and the adapter, before their sum


def _attention_scores(shape: ModelShape, setup: TrainerSetup) -> int:
    if setup.attention != "dense":
        return 0
    s = setup.micro_batch_tokens
    if setup.backend == "megatron":  # [b, heads/TP, S, S] scores in the compute dtype plus a float32 softmax
        return s * s * (shape.heads // setup.tensor_parallel) * (setup.compute_bytes + 4) + s * s
    return s * s  # transformers' [1, 1, S, S] boolean mask (the kernel blocks its scores)


def _static_terms(shape: ModelShape, setup: TrainerSetup) -> dict[str, int]:
    n, b = shape.params, setup.compute_bytes
    n_rank = n
    if setup.backend == "megatron":
        tp, pp, ep = setup.tensor_parallel, setup.pipeline_parallel, setup.expert_parallel
        # experts split over EP and the stages (not over TP), the rest over TP and the stages
        dense, experts = (n - shape.expert_params) // (tp * pp), shape.expert_params // (pp * ep)
        n_rank = dense + experts
        weights, grads = n_rank * b, n_rank * 4  # Megatron accumulates (and reduces) gradients in float32
        shard, expert_shard = ((setup.data_parallel, max(setup.data_parallel * tp // ep, 1))
                               if setup.distributed_optimizer else (1, 1))
        held = dense // shard + experts // expert_shard
        master = held * 4 if b < 4 else 0
        optimizer = held * 8
    elif setup.sharded:
        d = setup.data_parallel
        held = 4 if setup.uses_masters else b
        # Gathered in the compute dtype while in use: the root's embedding(s) and two layers (current, next).
        weights = (shape.embedding_params + 2 * shape.layer_params) * b
        master = n * held // d
        grads = n * (4 if setup.uses_masters else b) // d + shape.layer_params * (b + 4)
        optimizer = n * 2 * (4 if setup.uses_masters else b) // d
    else:
        weights = n * b
        master = n * 4 if setup.uses_masters else 0
        grads = n * (4 if setup.uses_masters else b)
        optimizer = n * 2 * (4 if setup.uses_masters else b)
    if setup.lora is not None:  # the frozen base, and the adapter with its gradients and Adam state
        adapter = shape.lora_params(setup.lora) * setup.adapter_bytes
        weights, grads, master, optimizer = n * b + adapter, adapter, 0, 2 * adapter
    if setup.optimizer_offload:
        master, optimizer = 0, 0
    reference = n_rank * b
    if setup.lora is not None:  # the KL reference is the base itself, the adapter disabled
        reference = 0
    return {"weights": weights, "gradients": grads, "master weights": master, "optimizer state": optimizer,
            "reference weights": reference if setup.reference_model else 0,
            "teacher weights": setup.teacher_params * b}


def plan_trainer_memory(shape: ModelShape, setup: TrainerSetup) -> TrainerMemory:
    """One trainer rank's memory for a step (see the module doc)."""
    terms = _static_terms(shape, setup)
    s = setup.micro_batch_tokens
    layers = -(-shape.layers // setup.pipeline_parallel)
    per_token = activation_bytes_per_token(shape, setup)
    by_mode = {mode: s * layers * value for mode, value in per_token.items()}
    kept, head_forward, head_backward = _head_bytes(shape, setup)
    mode = setup.activation_checkpointing
    terms["activations"] = by_mode[mode] + kept
    terms["logits working set"] = max(head_forward, head_backward)
    terms["attention scores"] = _attention_scores(shape, setup)
    recompute = s * (per_token["none"] if mode == "full" else per_token["none"] - per_token["selective"]
                     if mode == "selective" else 0)
    terms["recomputed layer"] = recompute + s * _layer_backward_bytes_per_token(shape, setup)
    # the micro-batch's routed-experts channel and its presence flags
    terms["routing"] = s * (shape.routing_bytes_per_token() + 1) if shape.is_moe else 0
    largest_param = shape.vocab * shape.hidden // (setup.tensor_parallel if setup.backend == "megatron" else 1)
    if setup.lora is not None:
        largest_param = setup.lora.rank * max(max(dims) for dims in shape.lora_targets(setup.lora).values())
    optimizer_temps = 0 if setup.fused_optimizer or setup.optimizer_offload else 2 * 4 * largest_param
    static = sum(terms[k] for k in ("weights", "gradients", "master weights", "optimizer state", "reference weights",
                                    "teacher weights"))
    step_peak = max(terms["activations"] + head_backward,
                    terms["activations"] + terms["recomputed layer"],
                    optimizer_temps)
    peak = static + step_peak + terms["attention scores"] + terms["routing"]
    resident = terms["weights"] + terms["reference weights"] + terms["teacher weights"]
    if setup.sharded and setup.uses_masters:  # the float32 shards stay
        resident = terms["master weights"] + terms["reference weights"] + terms["teacher weights"]
    notes = []
    if setup.backend == "megatron":
        notes.append("Megatron figures: itemised for its local layer spec, not measured")
    if shape.is_moe:
        experts = s * layers * _expert_activation_bytes_per_token(shape, setup)
        notes.append(f"dispatched expert activations {experts / GIB:.1f} GiB without checkpointing (balanced routing)")
    return TrainerMemory(terms=terms, activations_by_mode={k: v + kept for k, v in by_mode.items()}, peak=peak,
                         resident=resident, notes=notes,
                         adapter_params=shape.lora_params(setup.lora) if setup.lora is not None else 0)


def engine_weight_bytes(shape: ModelShape, dtype_bytes: int, tensor_parallel: int = 1) -> int:
    """One engine rank's weights (layers and the vocabulary split over TP; norms are small)."""
    return shape.params * dtype_bytes // tensor_parallel


def engine_adapter_bytes(shape: ModelShape, lora: LoraSettings, *, slots: int, dtype_bytes: int,
                         tensor_parallel: int = 1) -> int:
    """One engine rank's LoRA buffers: SGLang allocates ``slots`` (``--max-loras-per-batch``) adapters
    of ``--max-lora-rank`` on every target, in the model's dtype, before it sizes the KV cache."""
    return slots * shape.lora_params(lora) * dtype_bytes // tensor_parallel


def engine_kv_tokens(shape: ModelShape, *, capacity_bytes: int, mem_fraction: float, tensor_parallel: int = 1,
                     dtype_bytes: int = 2, adapter_bytes: int = 0) -> int:
    """How many tokens one engine's KV cache holds: the static pool (``mem_fraction`` of the device)
    minus the rank's weights (and ``adapter_bytes`` of LoRA buffers), over the KV bytes per token (0
    when the weights do not fit)."""
    pool = int(capacity_bytes * mem_fraction) - engine_weight_bytes(shape, dtype_bytes, tensor_parallel) - adapter_bytes
    return max(pool, 0) // shape.kv_bytes_per_token(dtype_bytes, tensor_parallel)
