"""The standalone HTML page: every table sortable (by mouse or keyboard), the figures inline.

The page works offline from one file: no external script, style or font. Sorting reorders the
first body of a table only; pinned rows (the paper's numbers, our paper-protocol rows) live in a
second body and never move.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from lengthgen.leaderboard.tables import Cell, Row, Table

STYLE = """*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1400px;
padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em}.meta{color:#555;margin-top:0}nav a{margin-right:.6em}
.scroll{overflow-x:auto;max-width:100%;margin:.8em 0 1.2em}
.scroll:focus-visible{outline:2px solid #1a66c9}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 5px;vertical-align:top}
th{background:#f0f0f0;text-align:left}
th button{font:inherit;font-weight:600;color:inherit;background:none;border:0;padding:0;cursor:pointer}
th button:focus-visible{outline:2px solid #1a66c9;outline-offset:2px}
th .ind{display:inline-block;min-width:1em;color:#1a66c9}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap;padding:3px 4px}
td.t{min-width:4em;overflow-wrap:anywhere}
td .ci{display:block;font-size:10.5px;color:#666;white-space:nowrap}td .ci.w{white-space:normal}
.scroll th:first-child,.scroll td:first-child{position:sticky;left:0;z-index:1;background:#fff;
box-shadow:1px 0 0 #bbb}
.scroll th:first-child{background:#f0f0f0}
tbody.pinned tr:first-child td{border-top:2px solid #777}
tbody.pinned td,.scroll tbody.pinned td:first-child{color:#555;background:#fafafa}
tr.paper td{font-style:italic}
tr.protocol td:first-child{font-weight:600}
abbr[title]{text-decoration:underline dotted;cursor:help}
figure{margin:1em 0}figure img{width:100%;max-width:1100px;height:auto}
figcaption{font-size:13px;color:#444;max-width:60em}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;white-space:pre;max-width:100%}
code{font-size:90%}
ul.verdicts{padding-left:1.2em;max-width:62em}ul.verdicts li{margin:.25em 0}
.hm-wrap{overflow-x:auto;max-width:100%;margin:.6em 0}
table.headline{font-size:13px}table.headline th,table.headline td{padding:4px 7px}
table.headline td{min-width:7.5em;text-align:center;font-variant-numeric:tabular-nums}
table.headline th[scope=row]{text-align:left;background:#f7f7f7}
.hm-main{display:block;font-weight:700;font-size:15px}.hm-seeds,.hm-paper{display:block;font-size:11px;color:#333}
.hm-paper{font-style:italic;color:#555}.hm-none{color:#999}
details{margin:.8em 0}details>summary{cursor:pointer;font-weight:600}summary>h3{display:inline}
#verified{color:#555;margin-top:0}#verified>summary{font-weight:400}#verified ul{margin:.3em 0}
@media (max-width:600px){body{margin:.6em auto;padding:0 .6em}table{font-size:12px}
table.headline td{min-width:5.6em;padding:3px 4px}.hm-main{font-size:13px}
.hm-seeds,.hm-paper{font-size:10px}}"""

SCRIPT = """(function () {
  function value(cell) {
    var v = cell.getAttribute('data-v');
    return v === null ? null : parseFloat(v);
  }
  function sortTable(table, col) {
    var heads = table.tHead.rows[0].cells, th = heads[col];
    var numeric = th.getAttribute('data-numeric') === '1';
    var current = th.getAttribute('aria-sort');
    var dir = current === 'none' ? (numeric ? 'descending' : 'ascending')
      : (current === 'ascending' ? 'descending' : 'ascending');
    for (var i = 0; i < heads.length; i++) {
      heads[i].setAttribute('aria-sort', 'none');
      heads[i].querySelector('.ind').textContent = '';
    }
    th.setAttribute('aria-sort', dir);
    th.querySelector('.ind').textContent = dir === 'ascending' ? '\\u25B2' : '\\u25BC';
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    var sign = dir === 'ascending' ? 1 : -1;
    rows.sort(function (a, b) {
      var x = a.cells[col], y = b.cells[col], vx = value(x), vy = value(y), d;
      if (vx !== null && vy !== null) { d = vx - vy; }
      else { d = x.textContent.localeCompare(y.textContent); }
      if (d !== 0) { return sign * d; }
      return parseInt(a.getAttribute('data-i'), 10) - parseInt(b.getAttribute('data-i'), 10);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  var tables = document.querySelectorAll('table.sortable');
  for (var t = 0; t < tables.length; t++) {
    (function (table) {
      var heads = table.tHead.rows[0].cells;
      for (var c = 0; c < heads.length; c++) {
        (function (col) {
          var button = heads[col].querySelector('button');
          button.addEventListener('click', function () { sortTable(table, col); });
        })(c);
      }
    })(tables[t]);
  }
})();"""


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def _cell(cell: Cell, numeric: bool) -> str:
    attrs = []
    if cell.sort is not None:
        attrs.append(f'data-v="{cell.sort:.6f}"')
    if cell.title:
        attrs.append(f'title="{_attr(cell.title)}"')
    if cell.span > 1:
        attrs.append(f'colspan="{cell.span}"')
    kind = "n" if numeric and cell.span == 1 else "t"
    kind_ci = "ci w" if cell.wrap else "ci"
    detail = f'<span class="{kind_ci}">{html.escape(cell.detail)}</span>' if cell.detail else ""
    opening = f'<td class="{kind}" {" ".join(attrs)}>'.replace(" >", ">")
    return opening + html.escape(cell.text) + detail + "</td>"


def _row(row: Row, numeric: Sequence[bool], index: int | None) -> str:
    attrs = f' class="{row.kind}"' if row.kind != "measured" else ""
    if index is not None:
        attrs += f' data-i="{index}"'
    cells, col = [], 0
    for cell in row.cells:
        cells.append(_cell(cell, numeric[col] if col < len(numeric) else False))
        col += cell.span
    return f"<tr{attrs}>" + "".join(cells) + "</tr>"


def html_table(table: Table) -> str:
    """A sortable table in a sideways-scrolling box; header buttons sort, pinned rows stay put."""
    heads = []
    for h in table.headers:
        title = f' title="{_attr(h.title)}"' if h.title else ""
        heads.append(f'<th scope="col" aria-sort="none" data-numeric="{1 if h.numeric else 0}"{title}>'
                     f'<button type="button">{html.escape(h.text)}</button>'
                     '<span class="ind" aria-hidden="true"></span></th>')
    numeric = [h.numeric for h in table.headers]
    out = [f'<div class="scroll" role="region" tabindex="0" aria-label="{_attr(table.label)}">',
           '<table class="sortable"><thead><tr>' + "".join(heads) + "</tr></thead>", "<tbody>"]
    out += [_row(r, numeric, i) for i, r in enumerate(table.rows)]
    out.append("</tbody>")
    if table.pinned:
        out.append('<tbody class="pinned">')
        out += [_row(r, numeric, None) for r in table.pinned]
        out.append("</tbody>")
    out.append("</table></div>")
    return "\n".join(out)


def code_spans(text: str) -> str:
    """Escape, then Markdown `code` spans → <code> (the prose is shared with the README)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def figure(svg: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(svg).decode()
    return (f'<figure><img alt="{_attr(alt)}" src="data:image/svg+xml;base64,{data}">'
            f"<figcaption>{code_spans(caption)}</figcaption></figure>")


@dataclass(frozen=True)
class Section:
    """One task: its heading id (from ``safe.slug``, never a raw name), title, blocks of HTML
    (tables, figures) in order."""

    anchor: str
    title: str
    blocks: tuple[str, ...]


def folded(summary: str, blocks: Sequence[str], anchor: str = "") -> str:
    """Blocks under a ``<details>`` element: on the page, one click away instead of in the way."""
    id_attr = f' id="{_attr(anchor)}"' if anchor else ""
    return f"<details{id_attr}><summary>{summary}</summary>\n" + "\n".join(blocks) + "\n</details>"


def page(*, title: str, meta: str, links: Sequence[tuple[str, str]], intro: Sequence[str],
         summary: str, sections: Sequence[Section], tail: Sequence[str], lead: Sequence[str] = (),
         meta_folded: Sequence[str] = ()) -> str:
    """The whole document. ``lead`` (the first screen: the answer), ``intro`` and ``tail`` are
    HTML blocks; ``meta`` is text with Markdown code spans, as the README shows it; ``meta_folded``
    (the verification's clauses) shows its first clause under it and folds the others, so that on a
    phone the answer is not a screen away."""
    e = html.escape
    link_html = " · ".join(f'<a href="{_attr(href)}">{e(text)}</a>' for text, href in links)
    nav = " ".join(f'<a href="#{_attr(s.anchor)}">{e(s.title)}</a>' for s in sections)
    head = [f"<h1>{e(title)}</h1>", f'<p class="meta">{code_spans(meta)} · {link_html}</p>']
    if meta_folded:
        first, *rest = meta_folded
        items = "".join(f"<li>{code_spans(clause)}</li>" for clause in rest)
        head.append(folded(code_spans(first), [f"<ul>{items}</ul>"] if items else [], "verified"))
    body = [*head, *lead, f"<nav>Tasks: {nav}</nav>", *intro, summary]
    for s in sections:
        body.append(f'<section id="{_attr(s.anchor)}"><h2>{e(s.title)}</h2>')
        body.extend(s.blocks)
        body.append("</section>")
    body.extend(tail)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{e(title)}</title>",
        f"<style>{STYLE}</style></head><body>", *body, f"<script>{SCRIPT}</script>", "</body></html>", "",
    ])
