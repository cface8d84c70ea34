"""Feeding a `--gamma auto` controller the rounds a run would report, without models."""

from __future__ import annotations


def drafted(
    c,
    *,
    drafted: int,
    accepted: int,
    draft: float | None,
    verify: float | None,
    verified: int | None = None,
    waited: bool = False,
    catch_up: float = 0.0,
):
    """One drafting round, as the loop reports it (draft and verify seconds None: not timed apart;
    `catch_up`: the draft's reading of ids it did not propose, before the round)."""
    from mlxspec.decoding.plan import Outcome, Plan

    ids = tuple(range(drafted))
    c.observe_round(
        Outcome(
            plan=Plan(draft=drafted),
            drafted=ids,
            accepted=accepted,
            next_id=0,
            emitted=ids[:accepted] + (0,),
            verified=verified or drafted + 1,
            seconds=(draft or 0.0) + (verify or 0.0),
            draft_seconds=draft,
            verify_seconds=verify,
            catch_up_seconds=catch_up,
        ),
        waited=waited,
    )
