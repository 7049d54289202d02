"""SGLang's Qwen3-MoE causal LM, with ``tie_word_embeddings`` honoured.

SGLang 0.5.23's ``Qwen3MoeForCausalLM`` always builds its own output head and its weight loader
never ties it to the input embedding (its dense Qwen3 class does both): a checkpoint saved with tied
embeddings has no ``lm_head.weight``, so the head stays as allocated and every token gets the same
logit, logprob -ln(vocab). The published Qwen3-MoE checkpoints are untied, but the tiny test and demo
models are not always. This subclass makes the head the embedding module itself when the config
ties them, as SGLang's Qwen3 does; an untied model is SGLang's class unchanged.
"""
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM as _SGLangQwen3Moe


class Qwen3MoeForCausalLM(_SGLangQwen3Moe):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        if getattr(config, "tie_word_embeddings", False) and self.pp_group.world_size == 1:
            self.lm_head = self.model.embed_tokens


EntryClass = Qwen3MoeForCausalLM
