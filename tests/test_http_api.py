"""The OpenAI-compatible HTTP API: a real server on loopback ports (gRPC and HTTP), real Ray, the real engine,
and the official `openai` client (httpx for the bodies no client would send).

Greedy replies are checked against the engine run alone on the same prompt; structured output against the
schema with `jsonschema`; the Responses chain's reuse of resident KV against the worker's prefill counter.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from engine_alone import greedy_alone  # noqa: E402 (tests/)

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.config import load_data  # noqa: E402
from swarm.http import views  # noqa: E402
from swarm.jobs import Job  # noqa: E402
from swarm.server import serve  # noqa: E402
from worker.engine import load_tokenizer  # noqa: E402
from worker.models import default_model_path  # noqa: E402

TOKEN = "test-token-http-51a9"
SYSTEM = "You are a helpful assistant. Answer briefly."
SWARM = "web"
CONFIG = f"""
name: {SWARM}
agents:
  - name: helper
    count: 3
    context: 2048
    system_prompt: {SYSTEM}
    max_new_tokens: 24
workers:
  - name: big
    kind: virtual
    device: x86-host
engine:
  threads: 1
"""
# A schema whose every valid value is short: the model must close it well within max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },  # fmt: skip
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def start_http_server(tmp: Path, config: str = CONFIG) -> Iterator[dict[str, Any]]:
    """One server (gRPC + HTTP) with one swarm launched; shared by a test module."""
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=0, http_port=0, token=TOKEN, out_root=tmp, echo=lambda m: None)
    grpc_client = SwarmClient(srv.target, token=TOKEN)
    grpc_client.launch(config)
    client = openai.OpenAI(base_url=srv.http.url, api_key=TOKEN, max_retries=0, timeout=300)
    try:
        yield {"server": srv, "client": client, "grpc": grpc_client, "url": srv.http.url}
    finally:
        client.close()
        grpc_client.close()
        srv.stop()
        scheduler.disconnect(conn)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from start_http_server(tmp_path_factory.mktemp("http"))


def _kv(api: dict[str, Any]) -> tuple[str, str]:
    w = api["server"].hub.swarm(SWARM).placement()["workers"][0]
    return w["kv_k"], w["kv_v"]


def _prefilled(api: dict[str, Any]) -> int:
    states = api["server"].hub.swarm(SWARM).sched.states()
    return sum(int(s["tokens_prefilled"]) for s in states.values() if isinstance(s, dict))


def _post(api: dict[str, Any], path: str, body: Any, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(api["url"] + path, content=content, headers={**headers, "Content-Type": "application/json"},
                      timeout=120)  # fmt: skip


def _error(r: httpx.Response) -> dict[str, Any]:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err  # type: ignore[no-any-return]


def test_models_list_the_base_model_agents_and_groups(api: dict[str, Any]) -> None:
    ids = [m.id for m in api["client"].models.list().data]
    assert ids[0] == "default"  # the default model, served by the swarm
    assert f"{SWARM}/helper" in ids  # the group
    assert {f"{SWARM}/helper-0", f"{SWARM}/helper-1"} <= set(ids)


def test_a_streamed_chat_completion_is_the_engines_greedy_reply(api: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    stream = api["client"].chat.completions.create(model="default", messages=messages, max_tokens=12,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    tok = load_tokenizer(default_model_path())
    want = greedy_alone(messages, 12, _kv(api))
    want_text = tok.decode([t for t in want if t not in tok.eot_ids], skip_special=True)
    assert text == want_text
    assert finish == ["length" if len(want) == 12 and want[-1] not in tok.eot_ids else "stop"]
    prompt = tok.encode(tok.render_chat(messages, add_generation_prompt=True))
    assert usage.prompt_tokens == len(prompt)
    assert usage.completion_tokens == len(want)
    assert usage.prompt_tokens_details.cached_tokens == 0  # a one-off session: nothing resident
    # The same job again by id, and through gRPC (the same durable job).
    job_id = chunks[0].id
    again = api["client"].chat.completions.retrieve(job_id)
    assert again.choices[0].message.content == want_text
    assert api["grpc"].job(job_id.removeprefix("chatcmpl-")).text == want_text
    # Durable: the store holds the job with what the HTTP answer needs, and a server restarted on that store
    # (which restores jobs with Job.restore) answers the same completion.
    store = api["server"].hub.store
    (rec,) = [j for j in store.jobs(SWARM) if j["id"] == job_id.removeprefix("chatcmpl-")]
    assert rec["request"]["api"]["kind"] == "chat"
    restored = views.chat_completion(Job.restore(rec))
    assert restored == again.model_dump(exclude_unset=True) | {"usage": restored["usage"]}
    assert restored["usage"]["completion_tokens"] == len(want)


def test_strict_json_schema_at_temperature_1_always_validates(api: dict[str, Any]) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    def one(seed: int) -> tuple[str, str | None]:
        r = api["client"].chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format=fmt, temperature=1.0, seed=seed, max_tokens=64,
        )  # fmt: skip
        return r.choices[0].message.content or "", r.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(20)))
    for text, finish in outs:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    assert len({t for t, _ in outs}) > 1  # sampled, not one greedy answer


def test_tool_choice_required_gives_arguments_valid_for_the_tool(api: dict[str, Any]) -> None:
    r = api["client"].chat.completions.create(
        model="default", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice="required", temperature=1.0, seed=3, max_tokens=64,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    # Streamed: the call arrives as tool_calls deltas that add up to the same kind of call.
    stream = api["client"].chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64, stream=True,
    )  # fmt: skip
    name, args, finish = "", "", None
    for c in stream:
        d = c.choices[0].delta
        for tc in d.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert (name, finish) == ("get_weather", "tool_calls")
    jsonschema.validate(json.loads(args), WEATHER_TOOL["function"]["parameters"])


def test_a_responses_chain_continues_on_resident_kv(api: dict[str, Any]) -> None:
    client = api["client"]
    model = f"{SWARM}/helper-1"
    seen = 0  # every token of the conversation so far: prompts and replies
    prev = None
    for i, text in enumerate(["Say hello.", "Now say goodbye.", "Thanks!"]):
        before = _prefilled(api)
        r = client.responses.create(model=model, input=text, previous_response_id=prev, max_output_tokens=16,
                                    temperature=0)  # fmt: skip
        u = r.usage
        new = u.input_tokens - u.input_tokens_details.cached_tokens
        assert _prefilled(api) - before == new  # the engine prefilled only the new input
        if i == 0:
            assert u.input_tokens_details.cached_tokens == 0
        else:
            assert u.input_tokens_details.cached_tokens >= seen  # all earlier turns stayed resident
            assert new < u.input_tokens_details.cached_tokens
        seen = u.input_tokens + u.output_tokens
        assert r.status in ("completed", "incomplete") and r.output_text == r.output[0].content[0].text
        assert client.responses.retrieve(r.id).output_text == r.output_text
        prev = r.id


def test_a_streamed_response_has_the_responses_events(api: dict[str, Any]) -> None:
    events = list(api["client"].responses.create(model="default", input="Hi", max_output_tokens=8, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_errors_have_the_openai_shape_and_codes(api: dict[str, Any]) -> None:
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = _post(api, "/chat/completions", {**chat, "temperature": 5})
    assert r.status_code == 400 and _error(r)["param"] == "temperature"
    r = _post(api, "/chat/completions", {**chat, "messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and _error(r)["param"] == "messages[0].role"
    for token in (None, "wrong-token"):
        r = _post(api, "/chat/completions", chat, token=token)
        assert r.status_code == 401 and _error(r)["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=api["url"], api_key="nope", max_retries=0).models.list()
    r = _post(api, "/chat/completions", {**chat, "model": "no-such-model"})
    assert r.status_code == 404 and "no-such-model" in _error(r)["message"]
    r = _post(api, "/chat/completions", {**chat, "model": f"{SWARM}/nobody"})
    assert r.status_code == 404
    with pytest.raises(openai.NotFoundError):
        api["client"].responses.retrieve("resp_0000000000000000")
    r = _post(api, "/responses", {"model": "default", "input": "x", "previous_response_id": "resp_missing"})
    assert r.status_code == 404
    # Not admissible: more new tokens than the context holds; the message says what would fit.
    r = _post(api, "/chat/completions", {**chat, "model": f"{SWARM}/helper", "max_tokens": 1 << 20})
    assert r.status_code == 429 and "max_tokens=" in _error(r)["message"]


def test_a_swarm_still_starting_is_503(api: dict[str, Any]) -> None:
    hub = api["server"].hub
    cfg = load_data(__import__("yaml").safe_load(CONFIG.replace(f"name: {SWARM}", "name: late")))
    run = hub._make(cfg)  # made, not yet started: the state a swarm has while its workers start
    hub.swarms["late"] = run
    try:
        assert run.state == "starting"
        r = _post(api, "/chat/completions", {"model": "late/helper", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and _error(r)["code"] == "swarm_starting"
    finally:
        del hub.swarms["late"]
        run.sched.shutdown()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "default", "messages": [', "body"),  # malformed JSON
        ({"model": "default", "messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "banana"}}}},
         "response_format.json_schema.schema"),  # not a JSON Schema
        ({"model": "default", "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER_TOOL, WEATHER_TOOL]},
         "tools[1].function.name"),  # duplicate tool names
    ],
)  # fmt: skip
def test_bad_bodies_are_400_and_nothing_runs(api: dict[str, Any], body: Any, param: str) -> None:
    before = len(api["grpc"].jobs(SWARM, limit=1000))
    r = _post(api, "/chat/completions", body)
    assert r.status_code == 400 and _error(r)["param"] == param
    assert len(api["grpc"].jobs(SWARM, limit=1000)) == before  # refused at the boundary: no job


def test_a_named_agent_conversation_prefills_only_new_messages(api: dict[str, Any]) -> None:
    client, model = api["client"], f"{SWARM}/helper-0"
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Pick a number."}]
    r1 = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "Again."}]
    before = _prefilled(api)
    r2 = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    u1, u2 = r1.usage, r2.usage
    assert u2.prompt_tokens_details.cached_tokens >= u1.prompt_tokens + u1.completion_tokens - 1
    assert _prefilled(api) - before == u2.prompt_tokens - u2.prompt_tokens_details.cached_tokens


def _mask(n_vocab: int, allowed: set[int]) -> list[int]:
    words = [0] * ((n_vocab + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return words


def test_the_engines_token_mask_is_honoured_in_the_batched_step() -> None:
    from worker.engine import Engine, Sampling

    eng = Engine(threads=1)
    nv = int(eng.config["n_vocab"])
    tok = eng.tokenizer
    stop = min(tok.eot_ids)
    prompt = tok.encode("The colours of the rainbow are")
    allowed = {11, 257, 1000, nv - 1}  # odd picks across the words, the last id included
    sp = Sampling(temperature=1.0, seed=5, max_new_tokens=40, stop_tokens=(stop,))
    masked = eng.add_sequence(prompt, sp)
    free = eng.add_sequence(prompt, sp)  # the same batch, unconstrained
    eng.set_token_mask(masked, _mask(nv, allowed))
    got: dict[int, list[int]] = {masked: [], free: []}
    for _ in range(12):
        for s, t in eng.step().items():
            got[s].append(t)
    assert len(got[masked]) == 12 and set(got[masked]) <= allowed
    assert not set(got[free]) <= allowed  # the other sequence is not constrained
    eng.set_token_mask(masked, _mask(nv, {stop}))  # only the stop token: the turn ends on it
    out = [t for s, t in eng.step().items() if s == masked]
    assert out == [stop] and eng.info(masked)["finish_reason"] == "stop_token"
    with pytest.raises(ValueError, match="32-bit words, expected"):
        eng.set_token_mask(free, [0xFFFFFFFF])
    with pytest.raises(ValueError, match="allows no token"):
        eng.set_token_mask(free, _mask(nv, set()))
    eng.clear_token_mask(free)


def test_tls_serves_https_with_the_same_tokens(api: dict[str, Any], tmp_path: Path) -> None:
    import ssl

    from test_api import _self_signed

    cert, key = _self_signed(tmp_path)
    # 127.0.0.1, which the certificate names: "localhost" would be two addresses (test_api.py's TLS test).
    srv = serve(conn=api["server"].hub.conn, host="127.0.0.1", port=0, http_port=0, token=TOKEN, tls=(cert, key),
                out_root=tmp_path, echo=lambda m: None)  # fmt: skip
    try:
        assert srv.http.url.startswith("https://127.0.0.1:")
        trust = ssl.create_default_context(cadata=cert.decode())
        with httpx.Client(verify=trust) as http:
            c = openai.OpenAI(base_url=srv.http.url, api_key=TOKEN, max_retries=0, http_client=http)
            assert c.models.list().data == []  # this server runs no swarm
            assert http.get(srv.http.url + "/models").status_code == 401  # no token
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.http.url.replace("https://", "http://") + "/models", timeout=5)  # plaintext is refused
    finally:
        srv.http.stop(1)
        srv.server.stop(1).wait(5)


def test_a_finished_completion_survives_a_server_crash(api: dict[str, Any], tmp_path: Path) -> None:
    conn, store = api["server"].hub.conn, tmp_path / "kvswarm.db"
    config = CONFIG.replace(f"name: {SWARM}", "name: dur").replace("count: 3", "count: 1")
    first = serve(conn=conn, port=0, http_port=0, token=TOKEN, out_root=tmp_path, store_path=store,
                  echo=lambda m: None)  # fmt: skip
    with SwarmClient(first.target, token=TOKEN) as c:
        c.launch(config)
    client = openai.OpenAI(base_url=first.http.url, api_key=TOKEN, max_retries=0, timeout=300)
    done = client.chat.completions.create(model="dur/helper-0", messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=6, temperature=0)  # fmt: skip
    first.http.stop(1)
    first.server.stop(0).wait(5)
    first.hub.crash()  # as a killed process: nothing more is recorded
    second = serve(conn=conn, port=0, http_port=0, token=TOKEN, out_root=tmp_path, store_path=store,
                   echo=lambda m: None)  # fmt: skip
    try:
        client = openai.OpenAI(base_url=second.http.url, api_key=TOKEN, max_retries=0, timeout=300)
        again = client.chat.completions.retrieve(done.id)
        assert again.choices[0].message.content == done.choices[0].message.content
        assert again.usage.completion_tokens == done.usage.completion_tokens
        assert "dur/helper-0" in [m.id for m in client.models.list().data]  # the swarm was resumed
        with SwarmClient(second.target, token=TOKEN) as c:
            assert c.job(done.id.removeprefix("chatcmpl-")).text == done.choices[0].message.content
    finally:
        second.stop()


def test_responses_function_tools_and_their_results(api: dict[str, Any]) -> None:
    client, fn = api["client"], WEATHER_TOOL["function"]
    tools = [{"type": "function", "name": fn["name"], "description": fn["description"], "parameters": fn["parameters"]}]
    r = client.responses.create(model=f"{SWARM}/helper-2", input="Weather in Rome?", tools=tools,
                                tool_choice="required", max_output_tokens=64, temperature=0)  # fmt: skip
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), fn["parameters"])
    follow = client.responses.create(
        model=f"{SWARM}/helper-2", previous_response_id=r.id, tools=tools, tool_choice="none", max_output_tokens=12,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}], temperature=0,
    )  # fmt: skip
    assert follow.output[0].type == "message" and follow.previous_response_id == r.id
    assert follow.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens + r.usage.output_tokens


def test_json_object_is_an_object_unless_cut_by_max_tokens(api: dict[str, Any]) -> None:
    r = api["client"].chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Give a JSON object with a colour."}],
        response_format={"type": "json_object"}, max_tokens=48, temperature=0,
    )  # fmt: skip
    text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
    assert text.startswith("{")
    assert finish == "length" or isinstance(json.loads(text), dict)  # the documented cut (docs/HTTP_API.md)
