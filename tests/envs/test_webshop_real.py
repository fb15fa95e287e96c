"""webshop_real: a one-line error without WebShop, the mapping against a scripted stand-in, and
parity with webshop_lite when the real environment is installed (skipped otherwise)."""

from __future__ import annotations

import importlib.util

import pytest

from streamrl.envs.webshop_lite import WebshopLiteEnv
from streamrl.envs.webshop_real import WebshopRealEnv, WebshopUnavailableError

HAS_WEBSHOP = importlib.util.find_spec("web_agent_site") is not None


@pytest.mark.skipif(HAS_WEBSHOP, reason="the real WebShop is installed")
def test_missing_webshop_is_one_clear_line(monkeypatch):
    monkeypatch.delenv("WEBSHOP_DIR", raising=False)
    with pytest.raises(WebshopUnavailableError) as error:
        WebshopRealEnv()
    message = str(error.value)
    assert "\n" not in message and "princeton-nlp/WebShop" in message and "WEBSHOP_DIR" in message


class _LiteAsReal:
    """webshop_lite dressed as WebAgentTextEnv (reset(session), step -> 4-tuple, get_available_actions)."""

    def __init__(self):
        self.lite = WebshopLiteEnv()
        self.received: list[str] = []

    def reset(self, session):
        observation, info = self.lite.reset(task_id=f"test/{session}")
        self.info, self.instruction_text = info, info["instruction"]
        return observation, None

    def step(self, action):
        self.received.append(action)
        result = self.lite.step(action)
        self.info = result.info
        return result.observation, result.reward, result.terminated, None

    def get_available_actions(self):
        return self.info["available_actions"]


def test_mapping_keeps_webshop_lite_strings():
    real, lite = WebshopRealEnv(_text_env=_LiteAsReal()), WebshopLiteEnv()
    obs_real, info_real = real.reset(task_id="test/4")
    obs_lite, info_lite = lite.reset(task_id="test/4")
    assert obs_real == obs_lite and info_real["admissible_actions"] == info_lite["admissible_actions"]
    while True:
        action = lite.expert_action()
        a, b = real.step(action), lite.step(action)
        assert a.observation == b.observation and a.info["admissible_actions"] == b.info["admissible_actions"]
        if b.terminated:
            break
    assert a.terminated and a.info["won"] and a.info["score"] == 100.0


def test_a_numbered_result_reaches_webshop_as_its_asin():
    text_env = _LiteAsReal()
    real = WebshopRealEnv(_text_env=text_env)
    real.reset(task_id="test/4")
    page = real.step("search[monitor arm]")
    third = [a for a in page.info["admissible_actions"] if a.startswith("click[b0")][2]
    assert real.step("click[3]").info["action_effective"] and text_env.received[-1] == third


@pytest.mark.skipif(not HAS_WEBSHOP, reason="the real WebShop (web_agent_site) is not installed")
def test_parity_with_the_real_webshop():  # pragma: no cover - needs the user's checkout and data
    real = WebshopRealEnv()
    observation, info = real.reset(task_id="test/0")
    assert observation.startswith("WebShop [SEP] Instruction: [SEP] ") and observation.endswith(" [SEP] Search")
    assert info["admissible_actions"][0] == "search[<your query>]"
    result = real.step(f"search[{info['instruction']}]")
    assert "Back to Search" in result.observation.split(" [SEP] ")
    assert any(a.startswith("click[b0") for a in result.info["admissible_actions"])
    assert real.step("click[nonexistent]").info["action_effective"] is False


def test_loadable_by_module_class_reference():
    from streamrl.envs import get_entry

    entry = get_entry("streamrl.envs.webshop_real:WebshopRealEnv")
    assert entry.env is WebshopRealEnv and entry.parser().fallback_chars == 20
