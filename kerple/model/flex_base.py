"""What every FlexAttention kernel of the project shares: compilation, kernel options, block masks.

:class:`FlexKernel` owns the compiled ``flex_attention``, a cache of block masks and the kernel
options (:mod:`kerple.model.flex_options`). Its :meth:`FlexKernel.attend` runs one attention:

* ``compile=False``: FlexAttention's unfused reference path (it materializes the scores; tests only).
* CPU: the compiled kernel with PyTorch's own options.
* CUDA: the compiled kernel with options chosen from the device and the score modification, and on
  Triton's out-of-resource failure the next smaller rung of the phase that failed, remembered per
  (device, dtype, head_dim, kind); after all rungs, a ``RuntimeError``. Never an unfused path: the
  recompile limit that would make Dynamo run ``flex_attention`` uncompiled is raised during the
  call and made a hard error past it. The backward kernel is compiled by PyTorch only at the first
  ``.backward()``, outside this call; so the first call that needs a gradient for a new shape runs
  the kernel once more on detached inputs and differentiates that copy, which compiles the
  backward here, where a failure can still be retried (the training backward then reuses it).
* Inside an enclosing ``torch.compile`` (``training.compile``) the chosen options are traced into
  the enclosing graph; a failure there is raised by that compilation, outside this call.
  :func:`kerple.model.decoder.compile_flex_kernels` therefore runs the model once with the layers
  uncompiled before training (this ladder chooses and tries the options there), then once compiled;
  a failure of the compiled run goes to :meth:`FlexKernel.recover`, which steps the failed phase
  down and drops the graphs for another try (gradients to the embedding output only: no parameter
  gradient is written).
* The phase a failure is charged to is the one whose shared-memory estimate is nearest to the
  "Required: N" of Triton's message (:meth:`~kerple.model.flex_options.OptionsLadder.failed_phase`),
  since Inductor may compile the forward and backward kernels together.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

try:  # torch >= 2.9; earlier releases return the log-sum-exp with return_lse=True
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # pragma: no cover - older torch
    AuxRequest = None

from kerple.model.flex_options import LadderKey, OptionsLadder, device_limits, is_out_of_resource
from kerple.positional.logit_term import unsafe_captures

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
RECOMPILE_LIMIT = 256  # compiled variants of flex_attention per process (shapes x score mods x options)


def lse_request(wanted: bool) -> dict[str, Any]:
    """The keyword that makes ``flex_attention`` return its log-sum-exp too (``{}`` when not ``wanted``)."""
    if not wanted:
        return {}
    return {"return_aux": AuxRequest(lse=True)} if AuxRequest is not None else {"return_lse": True}


def split_lse(result: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, lse)`` from what ``flex_attention`` returned under :func:`lse_request`; ``lse [b, H, q]``
    float32 in natural-log units."""
    output, aux = result
    return output, getattr(aux, "lse", aux)


def _recompile_guard() -> Any:
    """Dynamo settings for one call: a recompile limit of at least :data:`RECOMPILE_LIMIT`, and a hard
    error past it instead of Dynamo's silent fallback to the uncompiled (unfused) function."""
    config = torch._dynamo.config
    limit_name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    settings: dict[str, Any] = {limit_name: max(getattr(config, limit_name), RECOMPILE_LIMIT)}
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(config, name):
            settings[name] = True
            break
    return config.patch(**settings)


class FlexKernel:
    """The compiled FlexAttention function of one model, its block masks and its kernel options.

    Subclasses build the score and mask modifications; :meth:`attend` runs them. A copy or an
    unpickled kernel starts with empty caches (a compiled function cannot be copied).
    """

    def __init__(self, compile: bool = True) -> None:
        self.compiled = compile
        self._compiled_attention = torch.compile(flex_attention, dynamic=False) if compile else None
        self._block_masks: dict[tuple, BlockMask] = {}
        self._ladder = OptionsLadder()
        self._backward_checked: set[tuple] = set()
        self.last_options: str | None = None  # the CUDA options of the last call that succeeded

    def arguments(self) -> dict[str, Any]:
        """The constructor arguments, for copies and pickles (subclasses add theirs)."""
        return {"compile": self.compiled}

    def __deepcopy__(self, memo: dict) -> FlexKernel:
        return type(self)(**self.arguments())

    def __getstate__(self) -> dict:
        return self.arguments()

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def cached_block_mask(self, key: tuple, build: Callable[[], BlockMask]) -> BlockMask:
        """The block mask cached under ``key``, built by ``build()`` on first use."""
        if key not in self._block_masks:
            self._block_masks[key] = build()
        return self._block_masks[key]

    def options_used(self) -> dict[str, str]:
        """The options chosen so far, per ``device / dtype / head_dim / kind`` (for reports)."""
        return {" / ".join(map(str, key)): self._ladder.describe(key) for key in self._ladder.keys()}

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        score_mod: ScoreMod | None,
        block_mask: BlockMask,
        captured: tuple[torch.Tensor, ...] = (),
        kind: str = "none",
        gathered_bytes: int = 0,
        return_lse: bool = False,
    ) -> Any:
        """FlexAttention of ``query [b, H, q, d]``, ``key``/``value [b, H, k, d]`` -> ``[b, H, q, d]``, or with
        ``return_lse`` ``(output, lse [b, H, q])`` (:func:`split_lse`).

        ``captured``: the tensors ``score_mod`` reads; ``kind`` and ``gathered_bytes`` describe it
        for the option choice (:class:`~kerple.positional.logit_term.LogitTerm`). A captured tensor
        that needs a gradient and is a view or a leaf is refused (``ValueError``): compiled, it would
        get no gradient (:func:`~kerple.positional.logit_term.kernel_tensor` makes the safe copy).
        """
        unsafe = unsafe_captures(captured)
        if unsafe:
            raise ValueError(
                f"captured tensors {unsafe} of the {kind!r} score modification need a gradient but are views or "
                "parameters, which compiled FlexAttention leaves without one; pass them through "
                "kerple.positional.logit_term.kernel_tensor"
            )
        extra = lse_request(return_lse)
        if self._compiled_attention is None:
            return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, **extra)
        limits = device_limits(query.device)
        if limits is None:
            return self._compiled_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, **extra)
        ladder_key: LadderKey = (limits.name, str(query.dtype).removeprefix("torch."), query.shape[-1], kind)
        if torch.compiler.is_compiling():
            options = self._ladder.options(ladder_key, limits, query.dtype, gathered_bytes)
            return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, kernel_options=options,
                                  **extra)
        with _recompile_guard():
            return self._attend_on_ladder(ladder_key, limits, (query, key, value), score_mod, block_mask, captured,
                                          gathered_bytes, extra)

    def recover(self, error: BaseException, raised_in: str) -> bool:
        """After ``error`` from an enclosing ``torch.compile`` (``training.compile``): if it is Triton's
        out-of-resource failure, step the phase it names down (:meth:`OptionsLadder.failed_phase`) for
        every key this kernel has options for, drop the compiled graphs, and return ``True`` (the
        caller retries). ``False`` for any other error, or before any options were chosen (keys are
        chosen by an eager run: Dynamo applies a traced call's changes to Python objects only after
        its graph ran, so a graph that failed to compile leaves none). At the smallest tiles:
        ``RuntimeError``."""
        if not is_out_of_resource(error) or not self._ladder.keys():
            return False
        for ladder_key in sorted(self._ladder.keys()):
            self._step_down(ladder_key, error, raised_in, " under training.compile")
        torch._dynamo.reset()  # the layers' graphs hold the failed options: trace them again
        return True

    def _step_down(self, ladder_key: LadderKey, error: BaseException, raised_in: str, where: str = "") -> None:
        """Step the phase ``error`` names down one rung; ``RuntimeError`` (from ``error``) at the bottom."""
        phase = self._ladder.failed_phase(ladder_key, error, raised_in)
        if not self._ladder.step_down(ladder_key, phase):
            raise RuntimeError(
                f"FlexAttention's {phase} kernel does not fit {ladder_key[0]} ({ladder_key[1]}, head_dim "
                f"{ladder_key[2]}, {ladder_key[3]}) even at the smallest tiles{where}: {error}. "
                "Use attention_impl: sdpa or eager for this model."
            ) from error

    def _attend_on_ladder(self, ladder_key: LadderKey, limits: Any, qkv: tuple[torch.Tensor, ...],
                          score_mod: ScoreMod | None, block_mask: BlockMask, captured: tuple[torch.Tensor, ...],
                          gathered_bytes: int, extra: dict[str, Any]) -> Any:
        """The compiled call with the ladder's options, stepping down on out-of-resource failures."""
        needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (*qkv, *captured))
        while True:
            options = self._ladder.options(ladder_key, limits, qkv[0].dtype, gathered_bytes)
            signature = _signature(ladder_key, qkv, score_mod, block_mask, captured)
            phase = "forward"
            try:
                if needs_backward and signature not in self._backward_checked:
                    copy, wanted = self._run_copy(qkv, score_mod, block_mask, captured, options, extra)
                    phase = "backward"  # PyTorch compiles the backward kernel here, at the first gradient
                    torch.autograd.grad(copy, wanted, torch.zeros_like(copy), allow_unused=True)
                    self._backward_checked.add(signature)
                    phase = "forward"
                output = self._compiled_attention(*qkv, score_mod=score_mod, block_mask=block_mask,
                                                  kernel_options=options, **extra)
            except Exception as error:
                if not is_out_of_resource(error):
                    raise
                self._step_down(ladder_key, error, phase)
                torch._dynamo.reset_code(flex_attention.__code__)  # drop the variants compiled with the failed options
                self._backward_checked.clear()
                continue
            self._ladder.confirm(ladder_key)
            self.last_options = self._ladder.describe(ladder_key)
            return output

    def _run_copy(self, qkv: tuple[torch.Tensor, ...], score_mod: ScoreMod | None, block_mask: BlockMask,
                  captured: tuple[torch.Tensor, ...], options: dict,
                  extra: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The kernel on detached copies of ``qkv`` (same ``requires_grad`` and outputs, hence the same
        compiled kernel as the real call), its attention output, and the tensors a gradient of it reaches."""
        inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in qkv)
        # identity hooks: an enclosing activation checkpoint's saved-tensor hooks must not see the copy
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            output = self._compiled_attention(*inputs, score_mod=score_mod, block_mask=block_mask,
                                              kernel_options=options, **extra)
        output = split_lse(output)[0] if extra else output
        return output, [t for t in (*inputs, *captured) if t.requires_grad]


def _signature(ladder_key: LadderKey, qkv: tuple[torch.Tensor, ...], score_mod: ScoreMod | None,
               block_mask: BlockMask, captured: tuple[torch.Tensor, ...]) -> tuple:
    """What makes PyTorch compile a new kernel: shapes, gradient needs, the score modification."""
    tensors = tuple((tuple(t.shape), t.dtype, t.requires_grad) for t in (*qkv, *captured))
    return ladder_key, tensors, getattr(score_mod, "__code__", None), id(block_mask)
