"""TRL's GRPOTrainer with rollouts sampled by `StaticCacheSampler` instead of `model.generate`.

Only sampling changes. Prompts, rewards, advantages, the loss and the optimizer step are TRL's own code, so the
GRPO update is the stock one by construction; what the fast path must get right is the sampling distribution, and
the tests and `benchmarks/gpu_step_time.py` check it against the training model's own log-probabilities.
Configurations the sampler does not cover (vLLM, paged generation, images, tools, other architectures, quantized
weights, repetition penalty, min-p) go to TRL's own generation, with one log line saying why.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from nodus.trainer import fast_backbone
from nodus.trainer.fast_backbone import FastBackbone
from nodus.trainer.fast_generation import FastWeights, Rollout, SamplingSettings, StaticCacheSampler, unsupported_reason
from nodus.trainer.rewards import ZERO_VARIANCE_METRIC
from trl import GRPOTrainer

log = logging.getLogger(__name__)



def zero_variance_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """The fraction of groups (consecutive `group_size` rewards; NaN: not graded) whose graded rewards are all the
    same, fewer than two included: every advantage in such a group is 0, so GRPO learns nothing from it."""
    grouped = rewards.view(-1, group_size)
    graded = ~torch.isnan(grouped)
    highest = torch.where(graded, grouped, -torch.inf).amax(dim=1)
    lowest = torch.where(graded, grouped, torch.inf).amin(dim=1)
    return float((~(highest > lowest)).float().mean().item())


class FastGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
    """GRPOTrainer whose rollouts come from a static-cache, CUDA-graph sampler.

    `fast_generation=False` makes it a plain GRPOTrainer (kept so one class serves both paths in benchmarks).
    `generation_times` records the wall time of each rollout (synchronised on CUDA), for profiling.
    """

    def __init__(
        self,
        *args: Any,
        fast_generation: bool = True,
        fast_training: bool = True,
        compile_layers: bool = False,
        compile_stack: bool = False,
        compile_mode: str | None = None,
        training_graphs: bool | str = False,
        prefill_graphs: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.fast_generation = fast_generation
        self.training_graphs = training_graphs
        self.prefill_graphs = prefill_graphs
        self.compile_layers = compile_layers
        self.compile_options: dict[str, Any] = {"compile_stack": compile_stack, "compile_mode": compile_mode}
        self.generation_times: list[float] = []
        self.last_rollout: Rollout | None = None
        self._sampler: StaticCacheSampler | None = None
        self._sampler_step = -1
        self._fallback_reason: str | None = None
        self._weights: FastWeights | None = None
        self.backbone: FastBackbone | None = None
        self.training_fallback_reason: str | None = "fast training forward switched off"
        model = self.accelerator.unwrap_model(self.model)
        model_reason = unsupported_reason(model) if fast_generation or fast_training else None
        if (fast_generation or fast_training) and model_reason is None:
            self._weights = FastWeights(model)
        if fast_training and model_reason is not None:
            self.training_fallback_reason = model_reason  # e.g. quantized layers: not "switched off"
        if fast_training and self._weights is not None:
            self.training_fallback_reason = fast_backbone.unsupported_reason(self._weights)
            if self.training_fallback_reason is None:
                self.backbone = FastBackbone(
                    self._weights, compile_layers=compile_layers, cuda_graphs=training_graphs, **self.compile_options
                )
                self.backbone.install()
            else:
                log.info("Training forwards use the model's own: %s.", self.training_fallback_reason)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # Gathered over every process here, as TRL's advantages are: whole groups, in order.
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable: an infrastructure failure
        mode = "train" if self.model.training else "eval"
        self._metrics[mode][ZERO_VARIANCE_METRIC].append(zero_variance_fraction(rewards, self.num_generations))
        return rewards_per_func

    @property
    def fast_weights(self) -> FastWeights | None:
        """The fused frozen weights the sampler and the backbone share (None when the fast path is off)."""
        return self._weights

    def release_training_memory(self) -> None:
        """After the last step: the rollout sampler (its KV cache, decode and prefill graphs) and the training graphs
        are never used again, and the final evaluation builds a sampler of its own beside them; free them first."""
        self._sampler = None
        self.last_rollout = None
        if self.backbone is not None:
            self.backbone.release_graphs()

    def fast_path_reason(self) -> str | None:
        """Why rollouts use TRL's generation instead of the fast sampler; None when the fast sampler is used."""
        if not self.fast_generation:
            return "fast generation switched off"
        if self.use_vllm:
            return "vLLM generation requested"
        if self.use_transformers_continuous_batching:
            return "transformers paged generation requested"
        if getattr(self, "tools", None):
            return "tool calling"
        model = self.accelerator.unwrap_model(self.model)
        return unsupported_reason(model, self.generation_config)

    def _generate_single_turn(
        self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int, has_tool_images: bool = False
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        started = _now(self.accelerator.device)
        if self._fallback_reason is None and not (images or multimodal_fields):
            self._fallback_reason = self.fast_path_reason() or ""
            if self._fallback_reason:
                log.info("Rollouts use TRL's model.generate: %s.", self._fallback_reason)
        result: tuple[list[list[int]], list[list[float]] | None]
        if self._fallback_reason or images or multimodal_fields:
            result = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        else:
            rollout = self._sampler_for_step().generate([list(p) for p in prompt_ids])
            self.last_rollout = rollout
            # TRL's own generate path returns no sampling log-probabilities; keep its behaviour identical.
            result = (rollout.completion_ids(), None)
        self.generation_times.append(_now(self.accelerator.device) - started)
        return result

    def _sampler_for_step(self) -> StaticCacheSampler:
        if self._sampler is None:
            model = self.accelerator.unwrap_model(self.model)
            settings = SamplingSettings.from_generation_config(self.generation_config, list(self.eos_token_ids))
            self._sampler = StaticCacheSampler(
                model,
                settings,
                pad_token_id=self._tokenizer.pad_token_id,
                compile_layers=self.compile_layers,
                weights=self._weights,
                prefill_graphs=self.prefill_graphs,
                **self.compile_options,
            )
            self._sampler_step = self.state.global_step
        elif self._sampler_step != self.state.global_step:
            self._sampler.refresh()  # the optimizer moved the weights since the last rollout
            self._sampler_step = self.state.global_step
        return self._sampler


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
