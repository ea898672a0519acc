"""Rule-based entity extraction: every rule in English and Japanese, boundaries, validators."""

from __future__ import annotations

import re
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiermem.errors import ValidationError
from tiermem.extraction import (
    DEFAULT_ENTITY_RULES,
    EntityRule,
    PhraseRule,
    RuleEntityExtractor,
    extract_entities,
)
from tiermem.models import Entity, TextBlock, ToolResultBlock, ToolUseBlock
from tiermem.policies.turn_text import TurnText, as_turn_text

TITLES = {
    "Berserk": "Berserk",
    "ベルセルク": "Berserk",
    "Vinland Saga": "Vinland Saga",
    "ヴィンランド・サガ": "Vinland Saga",
    "Final Fantasy": "Final Fantasy",
}
EXTRACTOR = RuleEntityExtractor(TITLES)


def pairs(text: str) -> list[tuple[str, str]]:
    return [(e.kind, e.value) for e in EXTRACTOR.extract(text)]


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("Where is order ORD-12345?", "order_id", "ORD-12345"),
        ("注文番号はord-98765です", "order_id", "ORD-98765"),
        ("ＯＲＤ－１２３４５の状況は？", "order_id", "ORD-12345"),  # full width
        ("Is B07X1Y2Z3Q in stock?", "asin", "B07X1Y2Z3Q"),
        ("ASINはB0CXYZ1234です", "asin", "B0CXYZ1234"),
        ("ISBN 978-4-08-851234-1", "isbn", "9784088512341"),
        ("9784088512341を探しています", "isbn", "9784088512341"),
        ("ISBN-10: 0306406152", "isbn", "0306406152"),
        ("isbn 0-306-40615-2", "isbn", "0306406152"),
        ("ISBN 0-8044-2957-X", "isbn", "080442957X"),
        ("mail me at Ken.Sato+manga@Example.CO.JP", "email", "Ken.Sato+manga@example.co.jp"),
        ("連絡先はken@example.comです", "email", "ken@example.com"),
        ("my budget is $50,000", "money", "USD 50000"),
        ("about $12.50 each", "money", "USD 12.50"),
        ("予算は¥1,200です", "money", "JPY 1200"),
        ("予算は1200円です", "money", "JPY 1200"),
        ("予算は１，２００円です", "money", "JPY 1200"),
        ("under 500 yen", "money", "JPY 500"),
        ("20 dollars", "money", "USD 20"),
        ("€9.99 shipping", "money", "EUR 9.99"),
        ("delivered on 2024-01-15?", "date", "2024-01-15"),
        ("2024年1月5日に届きました", "date", "2024-01-05"),
        ("Berserk vol 42", "volume", "42"),
        ("vol. 42 please", "volume", "42"),
        ("Volume 3", "volume", "3"),
        ("vol.007", "volume", "7"),
        ("42巻ありますか", "volume", "42"),
        ("第42巻", "volume", "42"),
        ("第 3 巻", "volume", "3"),
        ("４２巻", "volume", "42"),
        ("in Japanese please", "language", "japanese"),
        ("ENGLISH edition", "language", "english"),
        ("日本語版", "language", "japanese"),
        ("英語で読みたい", "language", "english"),
        ("I like seinen", "genre", "seinen"),
        ("shōnen or shounen", "genre", "shonen"),
        ("Shojo manga", "genre", "shojo"),
        ("josei and isekai", "genre", "josei"),
        ("dark fantasy", "genre", "dark fantasy"),
        ("セイネン", "genre", "seinen"),
        ("青年漫画", "genre", "seinen"),
        ("少年ジャンプ", "genre", "shonen"),
        ("少女漫画", "genre", "shojo"),
        ("異世界もの", "genre", "isekai"),
        ("ホラーは苦手", "genre", "horror"),
        ("do you have berserk?", "series", "Berserk"),
        ("ベルセルクの新刊", "series", "Berserk"),
        ("VINLAND   SAGA", "series", "Vinland Saga"),
        ("ヴィンランド・サガ", "series", "Vinland Saga"),
    ],
)
def test_each_rule(text: str, kind: str, value: str) -> None:
    assert (kind, value) in pairs(text)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("XORD-12345", "order_id"),  # glued to a word
        ("ORD-123", "order_id"),  # too short
        ("AB07X1Y2Z3Q", "asin"),
        ("B07X1Y2Z3QQ", "asin"),  # eleven characters
        ("b07x1y2z3q", "asin"),  # ASINs are upper case
        ("ISBN 978-4-08-851234-5", "isbn"),  # bad check digit
        ("call 0312345678", "isbn"),  # a bare 10-digit number: a phone, not an ISBN
        ("tel 0306406152 - any time", "isbn"),  # even with a valid check digit
        ("user@localhost", "email"),
        ("a@b.1", "email"),
        ("v1200円", "money"),  # glued to a word
        ("2024-02-30", "date"),  # no such day
        ("2024-13-01", "date"),
        ("20240-01-15", "date"),
        ("volcano 3", "volume"),  # "vol" inside a word
        ("evolve 3", "volume"),
        ("notebook 42", "volume"),
        ("fantasyland", "genre"),
        ("horrorcore", "genre"),
        ("Englishman", "language"),
        ("Berserker", "series"),  # a longer word is not the title
        ("xberserk", "series"),
    ],
)
def test_near_misses_are_not_entities(text: str, kind: str) -> None:
    assert kind not in [k for k, _ in pairs(text)]


def test_entities_come_once_in_order_of_first_appearance() -> None:
    text = "Berserk vol 3? No, 3巻 of ベルセルク in 日本語, or vol 4. ¥1,200 or 1200円. Berserk"
    assert pairs(text) == [
        ("series", "Berserk"),
        ("volume", "3"),
        ("language", "japanese"),
        ("volume", "4"),
        ("money", "JPY 1200"),
    ]


def test_the_longest_name_wins_and_a_title_hides_the_words_inside_it() -> None:
    assert pairs("Final Fantasy, then dark fantasy, then fantasy") == [
        ("series", "Final Fantasy"),
        ("genre", "dark fantasy"),
        ("genre", "fantasy"),
    ]


def test_extract_entities_reads_text_tool_inputs_and_results() -> None:
    blocks = [
        TextBlock(text="Is ORD-55555 shipped?"),
        ToolUseBlock(tool_use_id="t1", name="lookup", input={"asin": "B000000001"}),
        ToolResultBlock(tool_use_id="t1", content=(TextBlock(text="ISBN 978-4-08-851234-1"),)),
    ]
    assert extract_entities(blocks) == (
        Entity(kind="order_id", value="ORD-55555"),
        Entity(kind="asin", value="B000000001"),
        Entity(kind="isbn", value="9784088512341"),
    )
    # Without a catalogue there are no series; with an extractor there are.
    assert extract_entities([TextBlock(text="Berserk")]) == ()
    assert extract_entities([TextBlock(text="Berserk")], extractor=EXTRACTOR) == (
        Entity(kind="series", value="Berserk"),
    )


def test_a_large_catalogue_is_matched_like_a_small_one() -> None:
    titles = {f"Series {i} Quest": f"S{i}" for i in range(1000)} | TITLES
    extractor = RuleEntityExtractor(titles)
    found = extractor.extract("I want series 999 quest and ベルセルク, not Series 1000 Quest")
    assert [(e.kind, e.value) for e in found] == [("series", "S999"), ("series", "Berserk")]


def test_rules_are_data() -> None:
    sku = EntityRule("sku", r"sku-[0-9]+", lambda m: m.group(0).upper(), requires=("sku-",))
    publishers = PhraseRule("publisher", {"Shueisha": "shueisha", "集英社": "shueisha"})
    extractor = RuleEntityExtractor(rules=[sku, publishers])
    assert extractor.extract("SKU-77 from 集英社, vol 3") == (
        Entity(kind="sku", value="SKU-77"),
        Entity(kind="publisher", value="shueisha"),
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EntityRule("", "x", lambda m: "x"), "needs a kind"),
        (lambda: EntityRule("k", "(", lambda m: "x"), "bad pattern"),
        (lambda: EntityRule("k", "ORD-[0-9]+", lambda m: "x"), "upper-case letters"),
        (lambda: PhraseRule("genre", {"seinen": " "}), "has no value"),
        (lambda: PhraseRule("genre", {" ": "seinen"}), "empty"),
        (lambda: PhraseRule("genre", {}), "empty"),
        (lambda: RuleEntityExtractor({"Berserk": ""}), "has no value"),
    ],
)
def test_bad_rules_are_rejected(build: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build()  # type: ignore[operator]


def test_an_upper_case_pattern_is_fine_when_not_folded_or_in_a_class() -> None:
    EntityRule("k", "ORD-[0-9]+", lambda m: "x", folded=False)
    EntityRule("k", r"(?P<Id>[A-Z0-9]+)\D", lambda m: "x")


# ---------------------------------------------------------------- properties


def isbn13_check(first12: str) -> str:
    total = sum(int(d) * (1 if i % 2 == 0 else 3) for i, d in enumerate(first12))
    return str((10 - total % 10) % 10)


@given(st.sampled_from(["978", "979"]), st.text("0123456789", min_size=9, max_size=9))
def test_every_valid_isbn13_is_found_and_every_wrong_check_digit_is_not(
    prefix: str, body: str
) -> None:
    good = prefix + body + isbn13_check(prefix + body)
    bad = prefix + body + str((int(good[-1]) + 1) % 10)
    assert ("isbn", good) in pairs(f"book {good} please")
    assert "isbn" not in [k for k, _ in pairs(f"book {bad} please")]


@given(st.dates(min_value=date(1000, 1, 1), max_value=date(9999, 12, 31)))
def test_every_calendar_date_is_found_in_both_forms(day: date) -> None:
    japanese = f"{day.year}年{day.month}月{day.day}日"
    assert ("date", day.isoformat()) in pairs(f"on {day.isoformat()}.")
    assert ("date", day.isoformat()) in pairs(f"{japanese}に")


@given(st.text(max_size=300))
def test_any_text_gives_unique_well_formed_entities(text: str) -> None:
    found = EXTRACTOR.extract(text)
    assert len(set(found)) == len(found)
    assert all(e.kind and e.value.strip() for e in found)
    for entity in found:
        if entity.kind == "volume":
            assert re.fullmatch("[1-9][0-9]*|0", entity.value)


@given(st.lists(st.sampled_from(["vol 3", "42巻", "seinen", "Berserk", "ORD-12345", "ok"])))
def test_joining_texts_never_loses_an_entity(parts: list[str]) -> None:
    joined = {(e.kind, e.value) for e in EXTRACTOR.extract(" ".join(parts))}
    separately = {(e.kind, e.value) for part in parts for e in EXTRACTOR.extract(part)}
    assert joined == separately


PASTE = "the weather was nice and we walked to the shop. " * 4_000  # ~200 KB


def test_a_long_paste_is_read_at_its_ends_only() -> None:
    middle = len(PASTE) // 2
    text = "Berserk vol 3. " + PASTE[:middle] + " ORD-11111 " + PASTE[middle:] + " ¥1,200"
    assert pairs(text) == [("series", "Berserk"), ("volume", "3"), ("money", "JPY 1200")]


@given(st.text(max_size=200))
def test_a_turn_text_gives_what_its_string_gives(text: str) -> None:
    assert EXTRACTOR.extract(TurnText.of(text)) == EXTRACTOR.extract(text)


@pytest.mark.parametrize(
    "text",
    [
        "Hello!",
        "ASIN B012345678, not b012345678",
        "ORD-12345 on 2024-01-15, ISBN 978-4-08-851234-1",
        "order ord-99999 for ¥1,200 and 500 yen, vol. 42 and 第3巻",
        "mail Someone@Example.COM about 2024年1月15日",
        "Ｂ０１２３４５６７８ and ＯＲＤ－１２３４５",  # full width: gates read NFKC text
    ],
)
def test_the_combined_gate_skips_only_rules_that_cannot_match(text: str) -> None:
    # Every rule run on its own (each checks its own gate) finds what the extractor,
    # which first skips the rules whose gate strings are absent, finds.
    view = as_turn_text(text).view
    expected = sorted(
        (start, end, rule.kind, value)
        for rule in DEFAULT_ENTITY_RULES
        for start, end, value in rule.find(view)
    )
    assert sorted(RuleEntityExtractor().find(text)) == expected
    assert expected or text == "Hello!"
