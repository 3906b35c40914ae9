"""Where every batch size reports: the milestones (``eval.milestones`` over ``budget_tokens``) a batch size's
optimizer steps reach, and the check that no step passes several of them. Plain spec logic (no torch, no Ray):
the driver's preflight, the REST service's submission check and a scaling study's members all use it.
"""

from __future__ import annotations

from sweeps.errors import InvalidInput
from sweeps.spec.sweep import SweepSpec

__all__ = ["check_milestones", "milestone_warnings", "most_milestones", "reported_milestones"]


def reported_milestones(milestones_tokens: list[int], step_tokens: int) -> list[int]:
    """The tokens seen at each report of a trial whose optimizer steps are ``step_tokens`` long.

    The loop (``workloads.train.loop.run_loop``) evaluates once after the step that passes a milestone; a
    step that passes several milestones gives one report for all of them, at the tokens actually
    seen. Returns the distinct report points, increasing (as many as ``milestones_tokens`` only when
    no step is longer than the spacing between two milestones).
    """
    seen: list[int] = []
    for m in milestones_tokens:
        at = -(-m // step_tokens) * step_tokens
        if not seen or at != seen[-1]:
            seen.append(at)
    return seen


def milestone_warnings(spec: SweepSpec) -> list[str]:
    """One sentence per batch size that cannot report at every milestone: its optimizer step
    (``B x context_length_tokens`` tokens, the batch ramp's last batch if ``batch_warmup``; with fine-tuning
    an upper bound, padding is not counted) is longer than the spacing of ``eval.milestones`` over
    ``budget_tokens``, so some milestones fold into one report and its curve has fewer points, at other
    tokens, than the smaller batch sizes'. :func:`check_milestones` refuses such a spec unless
    ``eval.allow_folded_milestones``; then these sentences are warnings."""
    milestones = spec.milestones_tokens()
    out = []
    for b in sorted(spec.search.batch_sizes_sequences):
        step_tokens = b * spec.model.context_length_tokens
        got = reported_milestones(milestones, step_tokens)
        if len(got) < len(milestones):
            out.append(
                f"search.batch_sizes_sequences: batch size {b} ({step_tokens} tokens per optimizer step) reports at "
                f"{len(got)} of the {len(milestones)} milestones (at {', '.join(str(t) for t in got)} tokens): its "
                f"step is longer than the milestone spacing ({milestones[0]} tokens)"
            )
    return out


def most_milestones(spec: SweepSpec) -> int:
    """The most ``eval.milestones`` at which every batch size reports once per milestone:
    ``budget_tokens // (max B x context_length_tokens)`` (at least 1)."""
    return max(1, spec.budget_tokens // (max(spec.search.batch_sizes_sequences) * spec.model.context_length_tokens))


def check_milestones(spec: SweepSpec) -> None:
    """Refuse a spec in which a batch size's optimizer step passes several milestones.

    Such a batch size is evaluated once for the milestones one step passes (there is no model state at
    the milestones it jumps over), so its curve would have fewer points than the others'. With
    ``eval.allow_folded_milestones: true`` the spec is accepted (and :func:`milestone_warnings` says which
    batch sizes fold, as warnings); each report records the tokens actually seen either way.

    Raises:
        InvalidInput: naming each such batch size, its tokens per step, where it would report, and what to
            change (``eval.milestones <=`` :func:`most_milestones`, a larger budget, smaller batch sizes,
            or the opt-in).
    """
    if spec.eval.allow_folded_milestones:
        return
    folded = milestone_warnings(spec)
    if folded:
        raise InvalidInput(
            "; ".join(folded) + f". Use eval.milestones <= {most_milestones(spec)} (every batch size then reports once "
            "at every milestone), a larger budget_tokens or smaller batch sizes; or set eval.allow_folded_milestones: "
            "true to accept fewer points for these batch sizes"
        )
