"""The swarm runtime (`swarm launch` and serve mode), one job per module.

    agents     the records (Agent, Turn, TurnRequest), which of their fields a snapshot holds, constants
    turns      an agent's turns: next request, encode, submit, end or fail       (TurnsMixin)
    placement  pure: GroupKey, Current, diff(plan, current) -> PlacementChange
    apply      the one imperative step: a PlacementChange carried out over Ray
    placer     planning, re-plans, losses, restarts and joins                     (PlacerMixin)
    admission  API jobs and one-off agents                                        (AdmissionMixin)
    record     snapshots to the store and restore                                 (RecordMixin)
    report     the API's views, the live progress rows, transcripts and summary   (ReportMixin)
    loop       SwarmRun: the threads, tick, begin/run/start/stop (composes the mixins above)
    names      agent names: sort key and compact form

Pure modules (placement, names, agents) import no Ray and no compiled engine.
"""
