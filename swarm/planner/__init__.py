"""Capacity planner: which agents go on which worker, and each worker's KV format.

Pure functions over plain data (model geometry, device profiles, calibration
tables, agent groups, a policy); it never imports Ray or the engine, so it can
plan for machines it is not running on. `plan(...) -> Plan` is a value: print
it, diff it, serialise it, then apply it.

The model (see docs/PLANNER.md for the derivations):

* Memory of a worker = resident weights + engine scratch + KV blocks. KV is
  reserved in whole blocks of `block_tokens` positions, exactly as the engine's
  pool allocates them; the full blocks of a group's shared system prompt are
  held once per worker (the engine's prefix sharing).
* One decode step = weight-stream time for the batch (shared by every agent on
  the worker) + for each agent, context x layers x the measured attention cost
  per position per layer of the worker's (K, V) format.
* Objective: the sum over workers of agents / step time (aggregate decode
  tokens/s at every agent's reserved context), subject to memory and to each
  group's quality floor.

The package, inputs to output: geometry (model shape, engine settings, scratch bytes), calibration
(measured costs, quality, the device), request (agent groups, policy), evaluate (one worker's
formats for given agent counts), search (`plan`: which agents go where), build (the Plan and the
words for each decision) and result (the Plan values, table and explanation). KV formats and pair
names come from worker.formats, EngineSettings from worker.settings; both are re-exported here.
"""

from swarm.planner.build import build_plan, why_nothing_fits
from swarm.planner.calibration import (
    DEFAULT_QUALITY_FLOOR,
    Calibration,
    DeviceProfile,
    Interval,
    Quality,
    QualityFloor,
)
from swarm.planner.geometry import ModelGeometry, scratch_bytes
from swarm.planner.parked import ParkedAgent, ParkedOnWorker, parked_bytes
from swarm.planner.request import AgentGroup, Policy
from swarm.planner.result import FormatOption, GroupOnWorker, Plan, WorkerPlan, render_table
from swarm.planner.search import plan
from worker.formats import KV_FORMATS, QUANTIZED, FormatPair, all_pairs, kv_row_bytes, pair_name, parse_pair
from worker.settings import EngineSettings

__all__ = [
    "DEFAULT_QUALITY_FLOOR",
    "KV_FORMATS",
    "QUANTIZED",
    "AgentGroup",
    "Calibration",
    "DeviceProfile",
    "EngineSettings",
    "FormatOption",
    "FormatPair",
    "GroupOnWorker",
    "Interval",
    "ModelGeometry",
    "ParkedAgent",
    "ParkedOnWorker",
    "Plan",
    "Policy",
    "Quality",
    "QualityFloor",
    "WorkerPlan",
    "all_pairs",
    "build_plan",
    "kv_row_bytes",
    "pair_name",
    "parked_bytes",
    "parse_pair",
    "plan",
    "render_table",
    "scratch_bytes",
    "why_nothing_fits",
]
