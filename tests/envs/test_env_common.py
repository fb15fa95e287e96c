"""The <think>/<action> projection shared by ALFWorld-style parsers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.envs.common import ThinkActionParser, contains_cjk, project_think_action, tagged_text


def test_well_formed_output_is_lowercased_and_stripped():
    parsed = project_think_action("<think>The apple is there.</think> <action> Go To Fridge 1 </action>")
    assert parsed.action == "go to fridge 1" and parsed.format_valid and parsed.reason is None


def test_missing_action_tags_send_the_last_30_characters_and_are_invalid():
    text = "<think>hmm</think> I would like to go to the countertop number one now"
    parsed = project_think_action(text)
    assert parsed.action == text.lower()[-30:] and not parsed.format_valid
    unclosed = project_think_action("<think>x</think><action>go to fridge 1")
    assert not unclosed.format_valid and unclosed.action == "<think>x</think><action>go to fridge 1"[-30:]


def test_missing_think_is_invalid_only_when_required():
    text = "<action>look</action>"
    assert not project_think_action(text).format_valid
    assert "think" in project_think_action(text).reason
    assert project_think_action(text, require_think=False).format_valid
    assert not project_think_action("<think>no closing tag <action>look</action>").format_valid


def test_cjk_characters_make_a_step_invalid():
    for char in ("苹", "ア", "한"):
        parsed = project_think_action(f"<think>{char}</think><action>look</action>")
        assert parsed.action == "look" and not parsed.format_valid
    assert not contains_cjk("plain ascii, café")


def test_first_action_tag_wins_and_empty_action_is_invalid():
    parsed = project_think_action("<think>a</think><action>look</action><action>inventory</action>")
    assert parsed.action == "look"
    assert tagged_text("</action> x <action>go</action>", "action") == "go"
    assert not project_think_action("<think>a</think><action>  </action>").format_valid


def test_parser_wraps_the_projection_with_its_settings():
    parser = ThinkActionParser(require_think=False, fallback_chars=20)
    assert parser.parse("<action>look</action>").format_valid
    assert parser.parse("x" * 50).action == "x" * 20
    with pytest.raises(ValueError, match="fallback_chars"):
        ThinkActionParser(fallback_chars=-1)


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(max_size=40),
    action=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="<>"), max_size=30),
    after=st.text(max_size=40),
)
def test_extracted_action_is_the_lowercased_tag_content(before, action, after):
    text = f"{before.replace('<', '')}<think>t</think><action>{action}</action>{after}"
    parsed = project_think_action(text)
    assert parsed.action == action.lower().strip()
    assert parsed.format_valid == (bool(parsed.action) and not contains_cjk(text))
