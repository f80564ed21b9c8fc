"""An agent framework from PyPI drives a small multi-agent flow with a tool against the HTTP API.

LangGraph (with langchain-openai's ChatOpenAI, which speaks Chat Completions): its graphs make a
multi-agent flow explicit (nodes, edges, a shared state), its ToolNode runs real Python tools from the
model's tool_calls, and it is the framework most agent code in the field is written against. The flow:
a researcher agent (the swarm's `helper-0` session) must call a weather tool (tool_choice forces it, so
even the 135M model makes a valid call), the tool runs, and a writer agent (`helper-1`) answers from the
tool's result. Real server, real Ray, real engine, no mocks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

pytest.importorskip("langgraph")
langchain_openai = pytest.importorskip("langchain_openai")
jsonschema = pytest.importorskip("jsonschema")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402
from test_http_api import SWARM, TOKEN, start_http_server  # noqa: E402 (tests/)

CALLS: list[dict[str, Any]] = []  # every call the tool received
FORECAST = {"paris": "sunny, 21 C", "oslo": "snow, -3 C"}


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    CALLS.append({"city": city})
    return FORECAST.get(city.strip().lower(), "cloudy, 12 C")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from start_http_server(tmp_path_factory.mktemp("http-agents"))


def test_langgraph_researcher_and_writer_with_a_tool(api: dict[str, Any]) -> None:
    def llm(agent: str) -> Any:
        return langchain_openai.ChatOpenAI(model=f"{SWARM}/{agent}", base_url=api["url"], api_key=TOKEN,
                                           temperature=0, max_tokens=48, max_retries=0, timeout=300)  # fmt: skip

    researcher = llm("helper-0").bind_tools([get_weather], tool_choice="get_weather")
    writer = llm("helper-1")

    def research(state: MessagesState) -> dict[str, Any]:
        return {"messages": [researcher.invoke(state["messages"])]}

    def write(state: MessagesState) -> dict[str, Any]:
        results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        assert results, f"no tool result in {state['messages']}"
        result = results[-1]
        question = state["messages"][0].content
        prompt = f"{question}\nThe weather tool says: {result.content}. Answer in one sentence."
        return {"messages": [writer.invoke([HumanMessage(prompt)])]}

    graph = StateGraph(MessagesState)
    graph.add_node("researcher", research)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_node("writer", write)
    graph.add_edge(START, "researcher")
    graph.add_edge("researcher", "tools")
    graph.add_edge("tools", "writer")
    graph.add_edge("writer", END)
    CALLS.clear()
    out = graph.compile().invoke({"messages": [HumanMessage("What is the weather in Paris?")]})

    msgs = out["messages"]
    call = msgs[1]
    assert isinstance(call, AIMessage) and len(call.tool_calls) == 1
    assert call.tool_calls[0]["name"] == "get_weather"
    schema = get_weather.tool_call_schema.model_json_schema()
    jsonschema.validate(call.tool_calls[0]["args"], schema)
    assert [call.tool_calls[0]["args"]] == CALLS  # the tool ran once, with the model's arguments
    assert isinstance(msgs[2], ToolMessage) and msgs[2].content == get_weather.invoke(CALLS[0])
    answer = msgs[-1]
    assert isinstance(answer, AIMessage) and isinstance(answer.content, str) and answer.content.strip()
    # Both agents' turns are durable jobs of the swarm, visible over gRPC.
    jobs = {j.agent: j for j in api["grpc"].jobs(SWARM, limit=100)}
    assert {"helper-0", "helper-1"} <= set(jobs)
    assert json.loads(jobs["helper-0"].text)["name"] == "get_weather"
