"""A LangGraph ReAct agent (LangChain's ChatOpenAI, a Python tool), trained by streamrl through its
endpoint without a change to the graph: only the model's base_url and api_key come from streamrl.

    streamrl train --config smoke --agent examples/langgraph_agent.py:run --tasks examples/pick_tasks.jsonl --out runs/graph
"""

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent


async def run(client, task):
    taken = []

    @tool
    def take(object: str) -> str:
        """Take one of the objects you see."""
        taken.append(object)
        return "Taken."

    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_tokens=32, max_retries=0)
    graph = create_react_agent(model, [take])
    try:
        await graph.ainvoke({"messages": [("user", f"{task['prompt']}\nCall take with the object.")]},
                            {"recursion_limit": 4})
    except GraphRecursionError:  # the model kept calling tools: scored on its first call
        pass
    return float(taken[:1] == [task["target"]])
