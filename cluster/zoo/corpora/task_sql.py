"""The sql task: a seeded generator of commented queries over four small schemas (shop, hr, school,
web): ``-- question`` then the query, upper-case keywords, one clause per line. A document is its own
source."""

from __future__ import annotations

import calendar
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

_PEOPLE = "Ada Lovelace|Grace Hopper|Alan Turing|Maria Garcia|Wei Chen|Priya Patel|Tom Novak|Sara Ali"
# One line per table: "column TYPE kind[=values]"; kinds: label (display name), cat, num=lo..hi,
# date, email, fk=table. Every table also has "id INTEGER PRIMARY KEY".
_SCHEMAS: dict[str, dict[str, str]] = {
    "shop": {
        "customers": f"name TEXT label={_PEOPLE}; email TEXT email; "
        "country TEXT cat=France|Germany|Japan|Brazil|Canada|India; signup_date DATE date",
        "products": "name TEXT label=Desk Lamp|Office Chair|Notebook|USB Cable|Monitor|Backpack; "
        "category TEXT cat=Furniture|Lighting|Stationery|Electronics; price REAL num=5..900; "
        "stock INTEGER num=0..500",
        "orders": "customer_id INTEGER fk=customers; order_date DATE date; "
        "status TEXT cat=pending|shipped|delivered|cancelled; total_amount REAL num=10..2000",
        "order_items": "order_id INTEGER fk=orders; product_id INTEGER fk=products; "
        "quantity INTEGER num=1..20; unit_price REAL num=5..900",
    },
    "hr": {
        "departments": "name TEXT label=Engineering|Sales|Marketing|Finance|Support|Legal; "
        "location TEXT cat=London|Berlin|Toronto|Singapore; budget INTEGER num=100000..5000000",
        "employees": f"name TEXT label={_PEOPLE}; department_id INTEGER fk=departments; "
        "job_title TEXT cat=Engineer|Analyst|Manager|Designer|Recruiter; hire_date DATE date; "
        "salary INTEGER num=30000..200000",
        "salaries": "employee_id INTEGER fk=employees; amount INTEGER num=30000..200000; "
        "effective_date DATE date",
    },
    "school": {
        "teachers": f"name TEXT label={_PEOPLE}; "
        "subject TEXT cat=Mathematics|Physics|History|Literature|Biology; hire_date DATE date",
        "courses": "title TEXT label=Algebra I|World History|Organic Chemistry|Poetry Workshop; "
        "teacher_id INTEGER fk=teachers; level TEXT cat=introductory|intermediate|advanced; "
        "credits INTEGER num=1..6",
        "students": f"name TEXT label={_PEOPLE}; city TEXT cat=Boston|Chicago|Denver|Seattle|Austin; "
        "grade_year INTEGER num=9..12; enrolled_on DATE date",
        "enrollments": "student_id INTEGER fk=students; course_id INTEGER fk=courses; "
        "semester TEXT cat=2023-spring|2023-fall|2024-spring|2024-fall; score INTEGER num=0..100",
    },
    "web": {
        "users": "username TEXT label=sky_walker|data_nerd|night_owl|pixel_pusher|coffee_fan; "
        "country TEXT cat=US|DE|FR|JP|BR|IN; plan TEXT cat=free|pro|team|enterprise; "
        "created_at TIMESTAMP date",
        "sessions": "user_id INTEGER fk=users; device TEXT cat=desktop|mobile|tablet; "
        "started_at TIMESTAMP date; duration_seconds INTEGER num=5..7200",
        "page_views": "session_id INTEGER fk=sessions; url TEXT cat=/home|/pricing|/docs|/blog|/signup; "
        "viewed_at TIMESTAMP date; load_ms INTEGER num=50..5000",
        "events": "user_id INTEGER fk=users; event_type TEXT cat=click|signup|purchase|share|logout; "
        "occurred_at TIMESTAMP date; value REAL num=0..500",
    },
}
_Sql = tuple[str, list[str]]  # (question, query lines)
_AGGREGATES = (("total", "SUM"), ("average", "AVG"), ("highest", "MAX"), ("lowest", "MIN"))


@dataclass(frozen=True)
class _Column:
    name: str
    type: str
    kind: str
    values: tuple[str, ...]  # choices for label/cat, (lo, hi) for num, (table,) for fk

    @property
    def words(self) -> str:
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class _Table:
    name: str
    columns: tuple[_Column, ...]  # without the implicit id

    @property
    def alias(self) -> str:  # order_items -> oi; unique within each schema
        return "".join(part[0] for part in self.name.split("_"))

    @property
    def plural(self) -> str:
        return self.name.replace("_", " ")

    @property
    def singular(self) -> str:
        return re.sub("ies$", "y", self.plural).removesuffix("s")

    @property
    def shown(self) -> str:  # the column a person would read: a name or title, else the id
        return next((c.name for c in self.of("label")), "id")

    def of(self, kind: str) -> list[_Column]:
        return [c for c in self.columns if c.kind == kind]


def _parse_table(name: str, spec: str) -> _Table:
    columns = []
    for entry in spec.split("; "):
        column, type_, kind = entry.split(" ", 2)
        kind, _, values = kind.partition("=")
        columns.append(_Column(column, type_, kind, tuple(re.split(r"\||\.\.", values))))
    return _Table(name, tuple(columns))


def sql_docs(seed: int) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    schemas = [[_parse_table(n, s) for n, s in tables.items()] for tables in _SCHEMAS.values()]
    templates = (_sql_filter, _sql_group, _sql_join, _sql_missing, _sql_cte, _sql_window, _sql_month,
                 _sql_insert, _sql_update, _sql_create)
    while True:
        question, clauses = rng.choice(templates)(rng, rng.choice(schemas))
        doc = f"-- {question}\n" + "\n".join(clauses) + ";"
        yield doc, doc  # generated: each document is its own source



def _with(rng: random.Random, tables: list[_Table], *kinds: str) -> _Table:
    """A table having every kind of column; each schema is written to have one for every template."""
    return rng.choice([t for t in tables if all(t.of(kind) for kind in kinds)])


def _parent(tables: list[_Table], fk: _Column) -> _Table:
    return next(t for t in tables if t.name == fk.values[0])


def _a(words: str) -> str:
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _number(rng: random.Random, column: _Column) -> int:
    return rng.randint(int(column.values[0]), int(column.values[1]))


def _sql_filter(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "num")
    num, k = rng.choice(t.of("num")), rng.choice((3, 5, 10, 20))
    head, order, v = [f"SELECT {t.shown}, {num.name}", f"FROM {t.name}"], f"ORDER BY {num.name} DESC", \
        _number(rng, num)
    return rng.choice([
        (f"Show the top {k} {t.plural} by {num.words}.", head + [order, f"LIMIT {k}"]),
        (f"Which {t.plural} have {_a(num.words)} above {v}, highest first?",
         head + [f"WHERE {num.name} > {v}", order]),
        (f"Which {t.plural} have {_a(num.words)} above the average?",
         head + [f"WHERE {num.name} > (SELECT AVG({num.name}) FROM {t.name})", order]),
    ])


def _sql_group(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "cat", "num")
    cat, num, (word, fn) = rng.choice(t.of("cat")), rng.choice(t.of("num")), rng.choice(_AGGREGATES)
    alias, v = f"{fn.lower()}_{num.name}", _number(rng, num)
    if rng.random() < 0.4:
        return f"How many {t.plural} are there for each {cat.words}?", [
            f"SELECT {cat.name}, COUNT(*) AS {t.name}_count", f"FROM {t.name}",
            f"GROUP BY {cat.name}", f"ORDER BY {t.name}_count DESC"]
    return f"What is the {word} {num.words} of {t.plural} per {cat.words}, if above {v}?", [
        f"SELECT {cat.name}, {fn}({num.name}) AS {alias}", f"FROM {t.name}", f"GROUP BY {cat.name}",
        f"HAVING {fn}({num.name}) > {v}", f"ORDER BY {alias} DESC"]


def _sql_join(rng: random.Random, tables: list[_Table]) -> _Sql:
    """An aggregate of a child table per parent row, sometimes two joins up (order_items per customer)."""
    c = _with(rng, tables, "fk", "num")
    num, (word, fn), k = rng.choice(c.of("num")), rng.choice(_AGGREGATES), rng.choice((5, 10, 25))
    hops = [(c, rng.choice(c.of("fk")))]  # (child, its foreign key), walking up to the parent
    while (up := _parent(tables, hops[-1][1])).of("fk") and rng.random() < 0.5:
        hops.append((up, rng.choice(up.of("fk"))))
    p, alias = _parent(tables, hops[-1][1]), f"{fn.lower()}_{num.name}"
    joins = [f"JOIN {child.name} AS {child.alias} ON {child.alias}.{key.name} = "
             f"{_parent(tables, key).alias}.id" for child, key in reversed(hops)]
    return f"What is the {word} {num.words} of {c.plural} for each {p.singular}? Show the top {k}.", [
        f"SELECT {p.alias}.{p.shown}, {fn}({c.alias}.{num.name}) AS {alias}",
        f"FROM {p.name} AS {p.alias}", *joins, f"GROUP BY {p.alias}.{p.shown}",
        f"ORDER BY {alias} DESC", f"LIMIT {k}"]


def _sql_missing(rng: random.Random, tables: list[_Table]) -> _Sql:
    c = _with(rng, tables, "fk")
    fk = rng.choice(c.of("fk"))
    p = _parent(tables, fk)
    head, on = [f"SELECT {p.alias}.{p.shown}", f"FROM {p.name} AS {p.alias}"], \
        f"{c.alias}.{fk.name} = {p.alias}.id"
    if rng.random() < 0.5:
        return f"Which {p.plural} have no {c.plural}?", head + [
            f"LEFT JOIN {c.name} AS {c.alias} ON {on}", f"WHERE {c.alias}.id IS NULL"]
    return f"List the {p.plural} without any {c.plural}.", head + [
        f"WHERE NOT EXISTS (SELECT 1 FROM {c.name} AS {c.alias} WHERE {on})"]


def _sql_cte(rng: random.Random, tables: list[_Table]) -> _Sql:
    c = _with(rng, tables, "fk", "num")
    fk, num = rng.choice(c.of("fk")), rng.choice(c.of("num"))
    p, v, total = _parent(tables, fk), _number(rng, num) * rng.choice((2, 5, 10)), f"total_{num.name}"
    return f"Which {p.plural} have a total {num.words} over {v}?", [
        "WITH totals AS (", f"    SELECT {fk.name}, SUM({num.name}) AS {total}", f"    FROM {c.name}",
        f"    GROUP BY {fk.name}", ")", f"SELECT {p.alias}.{p.shown}, totals.{total}", "FROM totals",
        f"JOIN {p.name} AS {p.alias} ON {p.alias}.id = totals.{fk.name}",
        f"WHERE totals.{total} > {v}", f"ORDER BY totals.{total} DESC"]


def _sql_window(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "cat", "num")
    cat, num, k = rng.choice(t.of("cat")), rng.choice(t.of("num")), rng.choice((1, 3, 5))
    over, shown = f"OVER (PARTITION BY {cat.name} ORDER BY {num.name} DESC)", \
        f"{t.shown}, {cat.name}, {num.name}"
    if rng.random() < 0.5:
        return f"Rank {t.plural} by {num.words} within each {cat.words}.", [
            f"SELECT {shown},", f"       RANK() {over} AS {num.name}_rank",
            f"FROM {t.name}", f"ORDER BY {cat.name}, {num.name}_rank"]
    return f"Find the top {k} {t.plural} by {num.words} in each {cat.words}.", [
        "WITH ranked AS (", f"    SELECT {shown},", f"           ROW_NUMBER() {over} AS row_num",
        f"    FROM {t.name}", ")", f"SELECT {shown}", "FROM ranked", f"WHERE row_num <= {k}"]


def _sql_month(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "date")
    day, year, month = rng.choice(t.of("date")), rng.randint(2021, 2024), rng.randint(1, 11)
    return f"List the {t.plural} whose {day.name} falls in {calendar.month_name[month]} {year}.", [
        "SELECT *", f"FROM {t.name}", f"WHERE {day.name} >= '{year}-{month:02d}-01'",
        f"  AND {day.name} < '{year}-{month + 1:02d}-01'", f"ORDER BY {day.name}"]


def _sql_insert(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = rng.choice(tables)
    values = {c.name: _sql_value(rng, c) for c in t.columns}
    label = next((values[c.name][1:-1] for c in t.of("label")), None)  # unquoted
    for c in t.of("email"):  # only tables with a label have an email
        values[c.name] = f"'{label.lower().replace(' ', '.')}@example.com'"
    question = f"Add a new {t.singular} named {label}." if label else f"Record a new {t.singular}."
    return question, [f"INSERT INTO {t.name} ({', '.join(values)})", f"VALUES ({', '.join(values.values())})"]


def _sql_value(rng: random.Random, column: _Column) -> str:
    if column.kind in ("label", "cat"):
        return f"'{rng.choice(column.values)}'"
    if column.kind == "num":
        return str(_number(rng, column))
    if column.kind == "fk":
        return str(rng.randint(1, 500))
    return f"'{rng.randint(2021, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}'"  # date


def _sql_update(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "cat", "num")
    cat, num, pct = rng.choice(t.of("cat")), rng.choice(t.of("num")), rng.choice((5, 10, 15, 20))
    value, row = rng.choice(cat.values), rng.randint(1, 500)
    if rng.random() < 0.5:
        return f"Increase the {num.words} of {t.plural} with {cat.words} {value} by {pct} percent.", [
            f"UPDATE {t.name}", f"SET {num.name} = {num.name} * {1 + pct / 100:.2f}",
            f"WHERE {cat.name} = '{value}'"]
    return f"Change the {cat.words} of {t.singular} number {row} to {value}.", [
        f"UPDATE {t.name}", f"SET {cat.name} = '{value}'", f"WHERE id = {row}"]


def _sql_create(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = rng.choice(tables)
    lines = ["    id INTEGER PRIMARY KEY"]
    for c in t.columns:
        required = " NOT NULL" if c.kind in ("fk", "label") or rng.random() < 0.3 else ""
        refers = f" REFERENCES {c.values[0]} (id)" if c.kind == "fk" else ""
        lines.append(f"    {c.name} {c.type}{required}{refers}")
    exists = " IF NOT EXISTS" if rng.random() < 0.5 else ""
    return f"Create the {t.name} table.", [f"CREATE TABLE{exists} {t.name} (", ",\n".join(lines), ")"]
