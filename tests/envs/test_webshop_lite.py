"""webshop_lite: reward formula, pages and transitions, invalid actions, determinism, splits, the
experts' success (environments.md §6, webshop_lite items 1-8)."""

from __future__ import annotations

import copy

import pytest

from streamrl.envs import make, make_parser, make_prompt_builder
from streamrl.envs.webshop_lite import parse_action
from streamrl.envs.webshop_lite.catalog import SUBCATEGORIES, build_catalog
from streamrl.envs.webshop_lite.expert import RandomShopper, Shopper, evaluate, parse_instruction
from streamrl.envs.webshop_lite.goals import build_goals
from streamrl.envs.webshop_lite.reward import _token_set_ratio_py, purchase_reward, token_set_ratio, type_reward


@pytest.fixture(scope="module")
def env():
    return make("webshop_lite")


def _goal_and_product(env, index=0):
    goal = env.goal_of(f"test/{index}")
    return goal, env.catalog.by_asin[goal["asin"]]


def _n(goal):
    return len(goal["attributes"]) + len(goal["goal_options"]) + 1


# -- reward formula --------------------------------------------------------------------------


def test_all_matched_gives_one(env):
    goal, product = _goal_and_product(env)
    reward, parts = purchase_reward(product, goal, product["price"], dict(goal["goal_options"]))
    assert reward == 1.0 and parts["r_type"] == 1.0 and parts["r_price"]


def test_missing_attribute_wrong_option_and_price_each_cost_one_share(env):
    for index in range(40):
        goal, product = _goal_and_product(env, index)
        n = _n(goal)
        options = dict(goal["goal_options"])
        # a missing attribute: the product no longer has it anywhere
        stripped = copy.deepcopy(product)
        wanted = goal["attributes"][0]
        stripped["Attributes"] = [a for a in stripped["Attributes"] if a != wanted]
        stripped["Title"] = stripped["name"] = stripped["Title"].lower().replace(wanted, "")
        stripped["BulletPoints"] = [b for b in stripped["BulletPoints"] if wanted not in b.lower()]
        assert purchase_reward(stripped, goal, product["price"], options)[0] == pytest.approx((n - 1) / n)
        # a wrong option
        name, value = next(iter(options.items()))
        other = next(v for v in product["options"][name] if v != value)
        assert purchase_reward(product, goal, product["price"], {**options, name: other})[0] == pytest.approx((n - 1) / n)
        # an option not chosen at all counts as not matched
        assert purchase_reward(product, goal, product["price"], {})[0] == pytest.approx((n - len(options)) / n)
        # the price over the bound
        assert purchase_reward(product, goal, goal["price_upper"] + 0.01, options)[0] == pytest.approx((n - 1) / n)


def test_wrong_product_type_scales_the_reward(env):
    goal, product = _goal_and_product(env)
    other = next(p for p in env.catalog.products if p["category"] != goal["category"])
    kind = type_reward(other, goal)
    assert not kind["query_match"] and not kind["category_match"]
    reward, parts = purchase_reward(other, goal, other["price"], {})
    assert parts["r_type"] == kind["r_type"] < 1.0
    # the raw formula, scaled
    assert reward == pytest.approx(kind["r_type"] * (parts["r_att"] * len(goal["attributes"]) + int(parts["r_price"])) / _n(goal))
    # WebShop's thresholds, on hand-made names
    base = {"query": "q", "product_category": "A › B › C", "name": "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"}
    assert type_reward({**base, "name": "zzz"}, base)["r_type"] == 0.0
    partial = type_reward({**base, "query": "x", "product_category": "X › Y", "name": "alpha beta"}, base)
    assert partial["title_score"] == pytest.approx(2 / 11) and partial["r_type"] == 0.5
    sparse = type_reward({**base, "query": "x", "product_category": "X › Y", "name": "alpha"}, base)
    assert sparse["title_score"] == pytest.approx(1 / 11) and sparse["r_type"] == 0.1
    same_category = type_reward({**base, "query": "x", "name": "alpha"}, base)
    assert same_category["r_type"] == 0.1  # a title score under 0.1 wins over the category match
    assert type_reward({**base, "name": "alpha beta gamma"}, base)["r_type"] == 1.0


def test_fuzzy_matching_follows_token_set_ratio():
    assert token_set_ratio("12 count", "12 count (pack of 1)") == 100
    assert token_set_ratio("gluten free", "dairy free") <= 85
    assert _token_set_ratio_py("Gluten-Free", "gluten free") == 100
    # no two values of a fuzzy-matched option group, nor two attributes of a subcategory, fuzzy-match
    # (size is matched exactly, as in WebShop)
    for sub in SUBCATEGORIES:
        groups = [values for name, values in sub.options.items() if name != "size"]
        for values in [*groups, sub.attributes]:
            for i, a in enumerate(values):
                for b in values[i + 1 :]:
                    assert token_set_ratio(a, b) <= 85, (a, b)


# -- pages, transitions, invalid actions -----------------------------------------------------


def test_reset_page_and_admissible(env):
    observation, info = env.reset(task_id="test/3")
    assert observation == f"WebShop [SEP] Instruction: [SEP] {info['instruction']} [SEP] Search"
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert info["admissible_actions"] == ["search[<your query>]"]


def test_search_results_item_subpages_and_navigation(env):
    _, info = env.reset(task_id="test/5")
    target = env.goal["asin"]
    title = env.catalog.by_asin[target]["Title"].lower()
    result = env.step(f"search[{title}]")
    obs = result.observation
    assert "Page 1 (Total results: 50)" in obs and "Next >" in obs and "< Prev" not in obs
    assert target in obs.split(" [SEP] ")
    asins = [c for c in result.info["available_actions"]["clickables"] if c.startswith("b0")]
    assert len(asins) == 10
    page2 = env.step("click[next >]")
    assert "Page 2 (Total results: 50)" in page2.observation and "< Prev" in page2.observation
    assert env.step("click[< prev]").observation == obs
    item = env.step(f"click[{target.lower()}]")
    assert item.info["page"] == "item"
    product = env.catalog.by_asin[target]
    for values in product["options"].values():
        assert set(values) <= set(item.info["available_actions"]["clickables"])
    assert item.observation.endswith("Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    value = next(iter(env.goal["goal_options"].values()))
    chosen = env.step(f"click[{value}]")
    assert chosen.observation == item.observation and env.state()["options"]  # recorded, not shown
    features = env.step("click[features]")
    assert product["BulletPoints"][0] in features.observation
    assert env.step("click[< prev]").observation == item.observation
    assert env.step("click[< prev]").observation == obs  # back to the same results page
    assert env.step("click[back to search]").info["page"] == "search"
    # every result click copies one of the spec's entity tokens verbatim
    assert set(asins) <= set(env.spec.entity_tokens) and len(env.spec.entity_tokens) == len(env.catalog.products)


def test_invalid_actions_are_noops(env):
    observation, _ = env.reset(task_id="test/1")
    for action in ["click[search]", "click[nonexistent]", "buy now", "click[buy now]", "dance", "search[]"]:
        result = env.step(action)
        assert result.observation == observation and result.reward == 0.0 and not result.terminated
        assert result.info["action_effective"] is False and result.info["invalid_action"] is True
    assert env.step("dance").info["format_valid"] is False
    assert env.step("click[nonexistent]").info["format_valid"] is True
    # search from an item page starts a new search
    env.reset(task_id="test/1")
    env.step("search[shoe]")
    first = env.state()["results"][0]
    env.step(f"click[{first.lower()}]")
    result = env.step("search[olive oil]")
    assert result.info["page"] == "results" and env.state()["keywords"] == "olive oil"


def test_oracle_purchase_and_truncation(env):
    _, info = env.reset(task_id="test/7")
    while True:
        result = env.step(env.expert_action())
        if result.terminated:
            break
    assert result.reward == 1.0 and result.info["won"] and result.info["score"] == 100.0
    assert result.info["reason"] == "won" and "Thank you for shopping with us!" in result.observation
    env.reset(task_id="test/7")
    for step in range(1, 16):
        result = env.step("click[nothing]")
        assert result.truncated == (step == 15) and not result.terminated
    assert result.info["reason"] == "max_steps" and result.reward == 0.0


def test_parse_action_like_webshop():
    assert parse_action("search[Red Shoes]") == ("search", "red shoes")
    assert parse_action("click[< Prev]") == ("click", "< prev")
    assert parse_action("look")[1] is None


# -- determinism and splits ------------------------------------------------------------------


def test_catalogue_and_goals_are_deterministic_and_splits_disjoint():
    catalog = build_catalog()
    assert len(catalog.products) >= 3000 and {p["category"] for p in catalog.products} == {
        "fashion", "makeup", "electronics", "furniture", "food"}
    assert catalog.digest() == build_catalog.__wrapped__().digest()
    goals = build_goals()
    assert goals.digest() == build_goals.__wrapped__().digest()
    assert goals.sizes()["test"] == 500
    keys = {s: {(g["asin"], g["instruction_text"]) for g in goals.splits[s]} for s in goals.splits}
    assert not keys["test"] & keys["train"] and not keys["test"] & keys["eval"] and not keys["eval"] & keys["train"]
    asins = {s: {g["asin"] for g in goals.splits[s]} for s in goals.splits}
    assert not asins["test"] & asins["train"]
    for product in catalog.products:  # option values never appear in the text (they count only when clicked)
        text = " ".join([product["Title"], *product["BulletPoints"], product["Description"]]).lower()
        assert not any(v in text for values in product["options"].values() for v in values)


def test_instruction_reads_back():
    goal = build_goals().splits["test"][0]
    body, options, bound = parse_instruction(goal["instruction_text"])
    assert options == goal["goal_options"] and bound == goal["price_upper"] and goal["query"] in body


# -- shoppers --------------------------------------------------------------------------------


def test_expert_shopper_and_random_on_the_500_test_goals(env):
    expert = evaluate(env, lambda e, o, i: e.expert_action(), "test")
    assert expert["success"] >= 0.95
    shopper = Shopper()
    non_privileged = evaluate(env, lambda e, o, i: shopper.act(o, i), "test")
    assert non_privileged["success"] >= 0.5
    rand = RandomShopper(0)
    random_policy = evaluate(env, lambda e, o, i: rand.act(o, i), "test")
    assert random_policy["success"] <= 0.05


def test_prompts_and_parser(env):
    observation, info = env.reset(task_id="test/2")
    result = env.step(env.expert_action())
    verl = make_prompt_builder("webshop_lite")
    content = verl.step_messages(observation, [(observation, "search[x]")], result.observation, result.info)[0]["content"]
    assert content.startswith("You are an expert autonomous agent operating in the WebShop")
    assert f"Your task is to: {info['instruction']}." in content and "'click[back to search]'" in content
    assert "[Observation 1: " in content and "<think>" in content
    compact = make_prompt_builder("webshop_lite", style="compact", require_think=False)
    short = compact.step_messages(observation, [], result.observation, result.info)[0]["content"]
    assert len(short) < len(content) and short.startswith("Task: ") and "Reply <action>" in short
    # compact: each clickable written once, as its action, each result on its own line, no Actions list
    result_lines = [line for line in short.splitlines() if line.startswith("click[b0")]
    assert len(result_lines) == 10 and "Actions:" not in short
    for action in result.info["admissible_actions"]:
        assert short.count(action) == 1, action
    first = result_lines[0].split(" | ")
    asin = first[0][len("click["):-1]
    assert asin.upper() in result.observation.split(" [SEP] ") and first[2].startswith("$")
    search_page = compact.step_messages(observation, [], observation, info)[0]["content"]
    assert "Actions: search[<your query>]" in search_page
    parsed = make_parser("webshop_lite").parse("<think>ok</think><action>click[Buy Now]</action>")
    assert parsed.format_valid and parsed.action == "click[buy now]"
    assert not make_parser("webshop_lite").parse("no tags here at all").format_valid


def test_numbered_results_click_the_kth_result_shown_and_nothing_else(env):
    from streamrl.envs.webshop_lite.text import resolve_result_number, shown_results

    observation, info = env.reset(task_id="test/4")
    assert shown_results(info["admissible_actions"]) == [] and env.step("click[1]").info["invalid_action"]
    page = env.step("search[monitor arm]")
    results = shown_results(page.info["admissible_actions"])
    assert [r[len("click["):-1].upper() for r in results] == env.state()["results"][:10]
    assert resolve_result_number("click[ 3 ]", lambda: page.info["admissible_actions"]) == results[2]
    assert resolve_result_number("click[11]", lambda: page.info["admissible_actions"]) == "click[11]"
    assert resolve_result_number("click[0]", lambda: page.info["admissible_actions"]) == "click[0]"
    assert env.step("click[11]").info["invalid_action"]  # past the page: a no-op like any unknown click
    page2 = env.step("click[next >]")
    item = env.step("click[2]")  # the second result of page 2
    assert item.info["page"] == "item" and env.state()["asin"] == env.state()["results"][11]
    assert shown_results(item.info["admissible_actions"]) == []  # an item page has no results
    assert resolve_result_number("click[2]", lambda: item.info["admissible_actions"]) == "click[2]"
    assert page2.info["page"] == "results"


def test_numbered_results_prompt_and_demonstrations(env):
    with pytest.raises(ValueError, match="number_results needs style 'compact'"):
        make_prompt_builder("webshop_lite", number_results=True)
    numbered = make_prompt_builder("webshop_lite", style="compact", require_think=False, number_results=True)
    observation, info = env.reset(task_id="test/2")
    assert numbered.shown_action("search[x]", observation, info) == "search[x]"
    page = env.step(env.expert_action())
    content = numbered.step_messages(observation, [], page.observation, page.info)[0]["content"]
    lines = [line for line in content.splitlines() if line.startswith("click[") and " | $" in line]
    assert [line.split(" | ")[0] for line in lines] == [f"click[{k}]" for k in range(1, 11)]
    assert "click[b0" not in content  # no ASIN left to copy
    titles = [part for part in page.observation.split(" [SEP] ")][-29::3]
    assert [line.split(" | ")[1] for line in lines] == titles
    # a demonstration's ASIN click is written as its number, and the number buys the same item
    target = env.expert_action()
    shown = numbered.shown_action(target, page.observation, page.info)
    assert shown == f"click[{env.state()['results'][:10].index(env.goal['asin']) + 1}]"
    while not (result := env.step(shown)).terminated:
        shown = numbered.shown_action(env.expert_action(), result.observation, result.info)
    assert result.info["won"]
