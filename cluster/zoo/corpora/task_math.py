"""The math task: a seeded generator of arithmetic word problems worked step by step ("Question:",
"Step n:", "Answer:"), every step an exact integer operation. A document is its own source."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam")
_ITEMS = ("notebooks", "apples", "pencils", "tickets", "cupcakes", "comic books", "plant pots")
_Problem = tuple[str, list[str], int]  # (question, steps, answer)
_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a // b,
}


def _calc(a: int, op: str, b: int) -> tuple[str, int]:
    """("a op b = c", c): every step the model sees is exact integer arithmetic."""
    if op == "/" and a % b:
        raise ArithmeticError(f"{a} / {b} is not an integer; the template chose bad numbers")
    result = _OPS[op](a, b)
    return f"{a} {op} {b} = {result}", result


def math_docs(seed: int) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    templates = (_shopping, _travel, _sharing, _garden, _discount, _packing, _wages, _expression)
    while True:
        question, steps, answer = rng.choice(templates)(rng)
        lines = [f"Question: {question}"] + [f"Step {i}: {s}" for i, s in enumerate(steps, 1)]
        doc = "\n".join(lines + [f"Answer: {answer}"])
        yield doc, doc  # generated: each document is its own source


def _shopping(rng: random.Random) -> _Problem:
    name, item, n, price = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(2, 9), rng.randint(2, 20)
    cost_text, cost = _calc(n, "*", price)
    bill = min(b for b in (20, 50, 100, 200) if b >= cost)
    change_text, change = _calc(bill, "-", cost)
    return (f"{name} buys {n} {item} at ${price} each and pays with a ${bill} bill. How much change "
            f"does {name} get?", [f"The {item} cost {cost_text} dollars.",
                                  f"The change is {change_text} dollars."], change)


def _travel(rng: random.Random) -> _Problem:
    vehicle = rng.choice(("train", "bus", "cyclist", "car", "ferry"))
    (s1, h1), (s2, h2) = [(rng.randint(10, 90), rng.randint(1, 6)) for _ in range(2)]
    (first_text, first), (second_text, second) = _calc(s1, "*", h1), _calc(s2, "*", h2)
    total_text, total = _calc(first, "+", second)
    return (f"A {vehicle} travels at {s1} km per hour for {h1} hours, then at {s2} km per hour for {h2} "
            f"hours. How many kilometres does it travel in total?", [f"First part: {first_text} km.",
            f"Second part: {second_text} km.", f"Total distance: {total_text} km."], total)


def _sharing(rng: random.Random) -> _Problem:
    name, trays, per = rng.choice(_NAMES), rng.randint(2, 9), rng.randint(4, 24)
    total_text, total = _calc(trays, "*", per)
    friends = rng.choice([k for k in range(2, 13) if total % k == 0])  # trays itself always divides
    each_text, each = _calc(total, "/", friends)
    return (f"{name} bakes {trays} trays of {per} cookies and shares them equally among {friends} "
            f"friends. How many cookies does each friend get?",
            [f"There are {total_text} cookies.", f"Each friend gets {each_text} cookies."], each)


def _garden(rng: random.Random) -> _Problem:
    length, width, cost = rng.randint(6, 30), rng.randint(5, 20), rng.randint(2, 9)
    side = rng.randint(2, min(length, width) - 1)
    (area_text, area), (patio_text, patio) = _calc(length, "*", width), _calc(side, "*", side)
    grass_text, grass = _calc(area, "-", patio)
    price_text, price = _calc(grass, "*", cost)
    return (f"A garden is {length} m long and {width} m wide. A square patio with sides of {side} m is "
            f"built in it, and grass seed for the rest costs ${cost} per square metre. How much does "
            f"the seed cost?", [f"The garden covers {area_text} square metres.", f"The patio covers "
            f"{patio_text} square metres.", f"Grass covers {grass_text} square metres.",
            f"The seed costs {price_text} dollars."], price)


def _discount(rng: random.Random) -> _Problem:
    item = rng.choice(("jacket", "bicycle", "lamp", "backpack", "guitar"))
    price, rate = 20 * rng.randint(1, 25), rng.choice(range(5, 55, 5))  # so price * rate / 100 is whole
    scaled_text, scaled = _calc(price, "*", rate)
    off_text, off = _calc(scaled, "/", 100)
    sale_text, sale = _calc(price, "-", off)
    return (f"A {item} costs ${price} and is on sale for {rate}% off. What is the sale price?",
            [f"Multiply the price by the rate: {scaled_text}.", f"The discount is {off_text} dollars.",
             f"The sale price is {sale_text} dollars."], sale)


def _packing(rng: random.Random) -> _Problem:
    crates, per, box = rng.randint(3, 12), rng.randint(3, 12), rng.randint(2, 6)
    total_text, total = _calc(crates, "*", per)
    broken = total - box * rng.randint(1, (total - 1) // box)  # what is left fills whole boxes
    rest_text, rest = _calc(total, "-", broken)
    boxes_text, boxes = _calc(rest, "/", box)
    return (f"A farm fills {crates} crates with {per} jars of honey each. {broken} jars crack, and the "
            f"rest are packed into boxes of {box}. How many boxes are filled?",
            [f"There are {total_text} jars.", f"Unbroken jars: {rest_text}.",
             f"Boxes filled: {boxes_text}."], boxes)


def _wages(rng: random.Random) -> _Problem:
    name, rate, hours, days = rng.choice(_NAMES), rng.randint(9, 40), rng.randint(3, 10), rng.randint(2, 6)
    daily_text, daily = _calc(rate, "*", hours)
    gross_text, gross = _calc(daily, "*", days)
    fee = rng.randint(1, gross // 4)
    net_text, net = _calc(gross, "-", fee)
    return (f"{name} earns ${rate} per hour and works {hours} hours a day for {days} days, then pays "
            f"${fee} in fees. How much does {name} keep?", [f"Each day pays {daily_text} dollars.",
            f"The days pay {gross_text} dollars.", f"After fees: {net_text} dollars."], net)


def _expression(rng: random.Random) -> _Problem:
    a, b, c = rng.randint(2, 50), rng.randint(2, 50), rng.randint(2, 12)
    sum_text, total = _calc(a, "+", b)
    product_text, product = _calc(total, "*", c)
    d = rng.randint(1, product - 1)  # keep the result positive
    result_text, result = _calc(product, "-", d)
    return (f"What is ({a} + {b}) * {c} - {d}?",
            [f"Add first: {sum_text}.", f"Multiply: {product_text}.", f"Subtract: {result_text}."], result)
