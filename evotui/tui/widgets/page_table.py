"""A page of rows drawn line by line: the rollout browser's table.

Why not `DataTable`: a DataTable renders each visible cell through Rich on every repaint, and a new
page changes its virtual size, which re-lays out the screen. Together that was most of a page's cost
(p50 ~100 ms on this 2-core machine). A page here is formatted once into one `Strip` per row when it
arrives; a repaint only crops those strips to the scroll offset and styles the cursor row, and the
widget's size never depends on its rows, so a new page is a repaint and never a layout.

The widget only renders: the screen hands it columns and rows (`show`) and hears back which row is
highlighted (`RowHighlighted`) or chosen (`RowSelected`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

#: A cell is plain text or styled `Text` (its `justify` is honored: "right" for numbers).
Cell = str | Text
#: Spaces after each column (the line starts with one).
GAP = 2


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    justify: str = "left"


def _pad(cell: str, width: int, justify: str) -> str:
    """Plain text padded to `width` cells (columns are as wide as their widest cell)."""
    pad = " " * (width - cell_len(cell))
    return pad + cell if justify == "right" else cell + pad


def _pad_styled(cell: Text, width: int, justify: str, console: Console) -> list[Segment]:
    """Styled text padded to `width` cells, as segments."""
    body = [s for s in cell.render(console) if s.text != "\n"]
    pad = Segment(" " * (width - cell.cell_len))
    return [pad, *body] if (cell.justify or justify) == "right" else [*body, pad]


def column_widths(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[int]:
    """Each column as wide as its widest cell or label."""
    widths = [cell_len(c.label) for c in columns]
    for row in rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], cell_len(value.plain if isinstance(value, Text) else value))
    return widths


class PageTable(ScrollView, can_focus=True):
    """A header line over one page of rows, with a row cursor; a new page costs one repaint."""

    DEFAULT_CSS = """
    PageTable {
        background: $surface;
        color: $foreground;
        &:focus { background-tint: $foreground 5%; }
        & > .page-table--header { text-style: bold; background: $panel; color: $foreground; }
        &:ansi > .page-table--header { background: ansi_bright_blue; color: ansi_default; }
        & > .page-table--even-row { background: $surface-lighten-1 50%; }
        &:dark > .page-table--even-row { background: $surface-darken-1 40%; }
        & > .page-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus > .page-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
    }
    """
    COMPONENT_CLASSES = {"page-table--header", "page-table--even-row", "page-table--cursor"}
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("home,g", "cursor_to(0)", "First row", show=False),
        Binding("end,G", "cursor_to(-1)", "Last row", show=False),
        Binding("left", "scroll_left", "Scroll left", show=False),
        Binding("right", "scroll_right", "Scroll right", show=False),
        Binding("enter", "select", "Open row", show=False),
    ]

    cursor_row: reactive[int] = reactive(0, always_update=True, init=False)

    class RowHighlighted(Message):
        """The cursor is on the row with this key."""

        def __init__(self, table: PageTable, index: int, key: str) -> None:
            super().__init__()
            self.table, self.index, self.key = table, index, key

        @property
        def control(self) -> PageTable:
            return self.table

    class RowSelected(RowHighlighted):
        """Enter (or a click on the cursor row) on the row with this key."""

    def __init__(self, columns: Sequence[Column], *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.columns = list(columns)
        self.widths = column_widths(self.columns, [])
        self.keys: list[str] = []
        self._strips: list[Strip] = []
        self._header: Strip | None = None  # formatted on the first `show`
        self._styles: tuple[Style, Style, Style, Style] | None = None

    # -- content ---------------------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self.keys)

    def show(self, rows: Sequence[Sequence[Cell]], keys: Sequence[str]) -> None:
        """Replace the rows (the columns stay) and put the cursor on the first; one repaint."""
        # Columns only widen while the screen lives, so paging does not make the table jump about.
        widths = [max(a, b) for a, b in zip(self.widths, column_widths(self.columns, rows), strict=True)]
        if widths != self.widths or self._header is None:
            self.widths = widths
            self._header = self._line([c.label for c in self.columns])
        self._strips = [self._line(row) for row in rows]
        self.keys = list(keys)
        self.virtual_size = Size(self.line_width, len(self.keys) + 1)  # a layout only if it changed
        self.scroll_to(0, 0, animate=False, immediate=True)
        self.cursor_row = 0
        self.refresh()

    @property
    def line_width(self) -> int:
        return 1 + sum(self.widths) + GAP * len(self.widths)

    def _line(self, row: Sequence[Cell]) -> Strip:
        """One row as a strip: a space, then each cell fitted to its column and followed by the gap.
        Runs of plain cells become one segment (most rows are one segment in all)."""
        segments: list[Segment] = []
        plain = [" "]
        gap = " " * GAP
        for cell, width, column in zip(row, self.widths, self.columns, strict=True):
            if isinstance(cell, Text) and (cell.spans or cell.style):
                segments += [Segment("".join(plain)), *_pad_styled(cell, width, column.justify, self.app.console)]
                plain = [gap]
            else:
                justify = (cell.justify or column.justify) if isinstance(cell, Text) else column.justify
                plain += (_pad(str(cell), width, justify or "left"), gap)
        segments.append(Segment("".join(plain)))
        return Strip(segments, self.line_width)

    def _row_styles(self) -> tuple[Style, Style, Style, Style]:
        """Plain, header, even-row and cursor styles (computed again after a style change)."""
        if self._styles is None:
            base = self.rich_style
            self._styles = (
                base,
                base + self.get_component_rich_style("page-table--header"),
                base + self.get_component_rich_style("page-table--even-row"),
                base + self.get_component_rich_style("page-table--cursor"),
            )
        return self._styles

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None  # focus, theme
        self.refresh()

    # -- drawing ---------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        base, header, even, cursor = self._row_styles()
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            if self._header is None:  # before the first page
                self._header = self._line([c.label for c in self.columns])
            strip, style = self._header, header
        else:
            index = scroll_y + y - 1
            if index >= len(self._strips):
                return Strip.blank(width, base)
            strip = self._strips[index]
            style = cursor if index == self.cursor_row else even if index % 2 else base
        return strip.crop_extend(scroll_x, scroll_x + width, None).apply_style(style)

    # -- the cursor ------------------------------------------------------------------------------
    def watch_cursor_row(self, old: int, new: int) -> None:
        if not self.keys:
            return
        self._scroll_to_row(new)
        self.refresh()
        self.post_message(self.RowHighlighted(self, new, self.keys[new]))

    def _scroll_to_row(self, row: int) -> None:
        visible = max(1, self.size.height - 1)  # under the header
        top = int(self.scroll_y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False, immediate=True)

    def move_cursor(self, row: int) -> None:
        if self.keys:
            self.cursor_row = max(0, min(row, len(self.keys) - 1))

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_cursor_to(self, row: int) -> None:
        self.move_cursor(row if row >= 0 else len(self.keys) - 1)

    def action_select(self) -> None:
        if self.keys:
            self.post_message(self.RowSelected(self, self.cursor_row, self.keys[self.cursor_row]))

    def action_page_down(self) -> None:
        self.move_cursor(self.cursor_row + max(1, self.size.height - 2))

    def action_page_up(self) -> None:
        self.move_cursor(self.cursor_row - max(1, self.size.height - 2))

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            return
        row = int(self.scroll_y) + event.y - 1
        if 0 <= row < len(self.keys):
            if row == self.cursor_row:
                self.action_select()
            else:
                self.move_cursor(row)


__all__ = ["Cell", "Column", "PageTable"]
