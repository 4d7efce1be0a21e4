"""The rollout browser's table: rows formatted once, a cursor that keeps itself in view."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot

from evotui.tui.widgets.page_table import Column, PageTable

COLUMNS = [Column("name", "name"), Column("score", "score", "right"), Column("note", "note")]


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        yield PageTable(COLUMNS, id="t")

    def on_page_table_row_highlighted(self, event: PageTable.RowHighlighted) -> None:
        self.events.append(("highlighted", event.key))

    def on_page_table_row_selected(self, event: PageTable.RowSelected) -> None:
        self.events.append(("selected", event.key))


def rows(n: int) -> tuple[list[list[str | Text]], list[str]]:
    cells: list[list[str | Text]] = [[f"row{i}", str(i * 10), "x" * (i % 3)] for i in range(n)]
    return cells, [f"k{i}" for i in range(n)]


def drive(script: Callable[[Pilot[None], TableApp, PageTable], Awaitable[None]], size: tuple[int, int]) -> None:
    async def main() -> None:
        app = TableApp()
        async with app.run_test(size=size) as pilot:
            table = app.query_one(PageTable)
            table.focus()
            await script(pilot, app, table)

    asyncio.run(main())


def line(table: PageTable, y: int) -> str:
    return table.render_line(y).text


def test_a_page_is_laid_out_in_columns_with_numbers_right_aligned() -> None:
    async def script(pilot: Pilot[None], app: TableApp, table: PageTable) -> None:
        cells, keys = rows(12)
        table.show(cells, keys)
        await pilot.pause()
        header, first, last = line(table, 0), line(table, 1), line(table, 11)
        assert table.widths == [len("row11"), len("score"), len("note")]  # the widest cell or label
        assert header.startswith(" name   score  note") and first.startswith(" row0       0  ")
        score_end = header.index("score") + len("score")
        assert first[:score_end].endswith(" 0") and last[:score_end].endswith(" 100")  # right-aligned
        assert table.render_line(1).cell_length == table.size.width
        assert app.events[-1] == ("highlighted", "k0")

    drive(script, (60, 20))


def test_columns_only_widen_and_styled_cells_keep_their_style() -> None:
    async def script(pilot: Pilot[None], app: TableApp, table: PageTable) -> None:
        table.show([["a-much-longer-name", "1", Text("yes", style="bold yellow")]], ["k0"])
        table.show([["b", "2", ""]], ["k1"])
        await pilot.pause()
        assert table.widths[0] == len("a-much-longer-name")  # the narrower page keeps the width
        table.show([["a", "1", Text("yes", style="bold yellow")]], ["k2"])
        strip = table.render_line(1)
        styled = [seg for seg in strip if seg.text == "yes"]
        assert styled and styled[0].style is not None and styled[0].style.bold

    drive(script, (60, 20))


def test_the_cursor_moves_scrolls_into_view_and_selects() -> None:
    async def script(pilot: Pilot[None], app: TableApp, table: PageTable) -> None:
        cells, keys = rows(50)
        table.show(cells, keys)
        await pilot.pause()
        visible = table.size.height - 1  # rows under the header
        await pilot.press("end")
        assert table.cursor_row == 49 and app.events[-1] == ("highlighted", "k49")
        assert table.scroll_y == 50 - visible  # the last row is the bottom line
        assert line(table, visible).startswith(" row49") and "name" in line(table, 0)  # the header stays
        await pilot.press("home", "down", "down", "enter")
        assert table.cursor_row == 2 and app.events[-1] == ("selected", "k2") and table.scroll_y == 0
        await pilot.press("up", "up", "up")  # stops at the first row
        assert table.cursor_row == 0
        # A new page puts the cursor back on its first row, scrolled to the top.
        await pilot.press("end")
        table.show(*rows(5))
        await pilot.pause()
        assert table.cursor_row == 0 and table.scroll_y == 0 and table.row_count == 5

    drive(script, (60, 12))


def test_a_click_moves_the_cursor_and_a_second_click_selects() -> None:
    async def script(pilot: Pilot[None], app: TableApp, table: PageTable) -> None:
        table.show(*rows(8))
        await pilot.pause()
        await pilot.click(PageTable, offset=(2, 4))  # the header is line 0, so the fourth row
        assert table.cursor_row == 3 and app.events[-1] == ("highlighted", "k3")
        await pilot.click(PageTable, offset=(2, 4))
        assert app.events[-1] == ("selected", "k3")

    drive(script, (60, 20))
