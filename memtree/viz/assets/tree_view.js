// memtree tree view: renders the JSON in #memtree-data. Every stored text is
// written with textContent (never innerHTML), so it always shows as text.
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("memtree-data").textContent);
  const nodes = DATA.nodes;
  const count = nodes.length;
  const items = new Array(count); // <li> of each rendered node
  const expanded = new Uint8Array(count);
  const DEPTH_COLORS = ["#3b6fd8", "#0f9d8a", "#b26bd8", "#e07b24", "#d23f74", "#5a8f29", "#2f8fc6", "#8a6d3b"];
  let selected = -1;
  let hits = new Map(); // node index -> {rank, score}
  let hitAncestors = new Set();
  let lexicalIndex = null;

  const $ = (id) => document.getElementById(id);

  function el(tag, className, text) {
    const element = document.createElement(tag);
    if (className) element.className = className;
    if (text !== undefined && text !== null) element.textContent = text;
    return element;
  }

  function flat(text) {
    return text.replace(/\s+/g, " ").trim();
  }

  function short(text, width) {
    const line = flat(text);
    return line.length <= width ? line : line.slice(0, width - 1).trimEnd() + "…";
  }

  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  function leafCount(n) {
    return n === 1 ? "1 leaf" : n + " leaves";
  }

  // -- the tree ---------------------------------------------------------------

  function makeItem(i) {
    const node = nodes[i];
    const li = el("li", "node " + (node.leaf ? "leaf" : "summary") + (node.stale ? " stale" : ""));
    li.dataset.index = String(i);
    li.dataset.id = node.id;
    li.dataset.depth = String(node.depth);
    li.setAttribute("role", "treeitem");
    const row = el("div", "row");
    row.tabIndex = -1;
    row.style.setProperty("--depth-color", DEPTH_COLORS[(node.depth - 1) % DEPTH_COLORS.length]);
    const caret = el("button", "caret");
    caret.type = "button";
    caret.tabIndex = -1;
    caret.setAttribute("aria-label", node.leaf ? "leaf" : "open or close");
    row.append(caret);
    row.append(el("span", "badge", node.leaf ? "leaf" : node.leaves + " leaves"));
    if (node.leaf && node.day) row.append(el("span", "when", node.day));
    row.append(el("span", "text", short(node.text, 400)));
    row.append(el("span", "rank"));
    li.append(row);
    items[i] = li;
    mark(i);
    if (!node.leaf && expanded[i]) {
      li.append(childList(i));
      li.classList.add("open");
    }
    li.setAttribute("aria-expanded", node.leaf ? "false" : String(Boolean(expanded[i])));
    return li;
  }

  function childList(i) {
    const list = el("ul", "kids");
    list.setAttribute("role", "group");
    for (const child of nodes[i].children) list.append(makeItem(child));
    if (nodes[i].hidden > 0) {
      list.append(el("li", "node leaf hidden-note", "… " + plural(nodes[i].hidden, "child") + " deeper than this page shows"));
    }
    return list;
  }

  function mark(i) {
    const li = items[i];
    if (!li) return;
    const hit = hits.get(i);
    li.classList.toggle("hit", Boolean(hit));
    li.classList.toggle("contains-hit", hitAncestors.has(i));
    li.querySelector(":scope > .row > .rank").textContent = hit ? "#" + hit.rank + " · " + hit.score.toFixed(2) : "";
    li.querySelector(":scope > .row").classList.toggle("selected", i === selected);
  }

  function render() {
    const tree = $("tree");
    tree.replaceChildren();
    items.fill(undefined);
    if (!count) {
      $("empty").hidden = false;
      return;
    }
    for (const child of nodes[0].children) tree.append(makeItem(child));
  }

  function setOpen(i, open) {
    const node = nodes[i];
    if (node.leaf || Boolean(expanded[i]) === open) return;
    expanded[i] = open ? 1 : 0;
    const li = items[i];
    if (!li) return;
    if (open && !li.querySelector(":scope > ul")) li.append(childList(i));
    li.classList.toggle("open", open);
    li.setAttribute("aria-expanded", String(open));
  }

  function openToDepth(depth) {
    for (let i = 0; i < count; i++) expanded[i] = !nodes[i].leaf && nodes[i].depth < depth ? 1 : 0;
    expanded[0] = 1;
    for (const i of hitAncestors) expanded[i] = 1;
    render();
  }

  function ancestors(i) {
    const out = [];
    for (let p = nodes[i].parent; p > 0; p = nodes[p].parent) out.push(p);
    return out;
  }

  function reveal(i) {
    let changed = false;
    for (const a of ancestors(i)) {
      if (!expanded[a]) {
        expanded[a] = 1;
        changed = true;
      }
    }
    if (changed) render();
    const li = items[i];
    if (li) li.querySelector(":scope > .row").scrollIntoView({ block: "nearest" });
  }

  // -- details ------------------------------------------------------------------

  function field(list, name, value, className) {
    if (value === null || value === undefined || value === "") return;
    list.append(el("dt", null, name));
    list.append(el("dd", className || null, String(value)));
  }

  function select(i, focus) {
    const previous = selected;
    selected = i;
    if (previous >= 0) mark(previous);
    reveal(i);
    mark(i);
    showDetails(i);
    if (focus && items[i]) items[i].querySelector(":scope > .row").focus({ preventScroll: true });
  }

  function nodeLink(i, text) {
    const link = el("a", null, text);
    link.href = "#";
    link.addEventListener("click", (event) => {
      event.preventDefault();
      select(i, true);
    });
    return link;
  }

  function showDetails(i) {
    const node = nodes[i];
    const body = $("detail-body");
    body.replaceChildren();
    const kind = el("div", "kind", node.leaf ? "Leaf" : "Summary of " + leafCount(node.leaves));
    kind.append(el("span", "flag", "depth " + node.depth));
    if (node.stale) kind.append(el("span", "flag stale", "stale: repair() will rewrite it"));
    const hit = hits.get(i);
    if (hit) kind.append(el("span", "flag hit", "result #" + hit.rank + " · score " + hit.score.toFixed(3)));
    body.append(kind);

    const crumbs = el("div", "crumbs");
    crumbs.append(el("span", null, "root"));
    for (const a of ancestors(i).reverse()) {
      crumbs.append(document.createTextNode(" › "));
      crumbs.append(nodeLink(a, short(nodes[a].text, 36)));
    }
    body.append(crumbs);
    body.append(el("div", "fulltext", node.text));

    const fields = el("dl", "fields");
    field(fields, node.leaf ? "event time" : "latest event", node.time);
    field(fields, "stored", node.created);
    if (node.updated !== node.created) field(fields, "updated", node.updated);
    field(fields, "source id", node.source);
    field(fields, "node id", node.id);
    if (!node.leaf) field(fields, "children", nodes[i].children.length + nodes[i].hidden);
    for (const [key, value] of Object.entries(node.meta || {})) {
      const isText = typeof value === "string";
      field(fields, "meta · " + key, isText ? value : JSON.stringify(value, null, 1), isText ? null : "json");
    }
    body.append(fields);

    if (!node.leaf && node.children.length) {
      body.append(el("div", "sub", "Children"));
      const list = el("ol", "child-list");
      for (const child of node.children.slice(0, 100)) {
        const item = el("li", null, (nodes[child].leaf ? "" : "[" + nodes[child].leaves + "] ") + short(nodes[child].text, 90));
        item.addEventListener("click", () => select(child, true));
        list.append(item);
      }
      if (node.children.length > 100) list.append(el("li", null, "… " + (node.children.length - 100) + " more"));
      body.append(list);
    }
  }

  // -- search -----------------------------------------------------------------

  const WORD = /[\p{L}\p{N}_]+/gu;

  function words(text) {
    return text.toLowerCase().match(WORD) || [];
  }

  function buildLexicalIndex() {
    const postings = new Map(); // word -> [[node, count], ...]
    const lengths = new Float64Array(count);
    let total = 0;
    for (let i = 1; i < count; i++) {
      const counts = new Map();
      for (const word of words(nodes[i].text)) counts.set(word, (counts.get(word) || 0) + 1);
      for (const [word, n] of counts) {
        if (!postings.has(word)) postings.set(word, []);
        postings.get(word).push([i, n]);
      }
      lengths[i] = words(nodes[i].text).length;
      total += lengths[i];
    }
    return { postings, lengths, average: total / Math.max(1, count - 1), documents: Math.max(1, count - 1) };
  }

  // BM25 (k1 = 1.2, b = 0.75) over every node but the root, like memtree's collapsed retrieval.
  function lexicalSearch(query, k) {
    if (!lexicalIndex) lexicalIndex = buildLexicalIndex();
    const { postings, lengths, average, documents } = lexicalIndex;
    const scores = new Map();
    for (const word of new Set(words(query))) {
      const list = postings.get(word);
      if (!list) continue;
      const idf = Math.log(1 + (documents - list.length + 0.5) / (list.length + 0.5));
      for (const [i, n] of list) {
        const part = (idf * n * 2.2) / (n + 1.2 * (0.25 + (0.75 * lengths[i]) / average));
        scores.set(i, (scores.get(i) || 0) + part);
      }
    }
    return [...scores.entries()]
      .sort((a, b) => b[1] - a[1] || a[0] - b[0])
      .slice(0, k)
      .map(([node, score], n) => ({ node, score, rank: n + 1 }));
  }

  function normalized(query) {
    return flat(query).toLowerCase();
  }

  function presetFor(query) {
    const key = normalized(query);
    return DATA.queries.findIndex((preset) => normalized(preset.query) === key);
  }

  function showHits(list) {
    hits = new Map(list.map((hit) => [hit.node, hit]));
    hitAncestors = new Set();
    for (const hit of list) for (const a of ancestors(hit.node)) hitAncestors.add(a);
    for (const a of hitAncestors) expanded[a] = 1;
    render();
    const results = $("result-list");
    results.replaceChildren();
    for (const hit of list) {
      const node = nodes[hit.node];
      const item = el("li");
      item.append(el("span", "score", hit.score.toFixed(2)));
      item.append(el("span", "kindtag", node.leaf ? "leaf" : "summary · " + node.leaves));
      item.append(document.createTextNode(short(node.text, 110)));
      item.addEventListener("click", () => select(hit.node, true));
      results.append(item);
    }
    $("results").hidden = list.length === 0;
    if (list.length && items[list[0].node]) items[list[0].node].querySelector(":scope > .row").scrollIntoView({ block: "center" });
  }

  function info(parts) {
    const box = $("search-info");
    box.replaceChildren();
    for (const part of parts) box.append(typeof part === "string" ? document.createTextNode(part) : part);
  }

  // Said next to the box before anyone types: the page cannot search by meaning.
  function searchNote() {
    const retrieved = DATA.queries.length
      ? "the queries under “Retrieved by memtree” were answered by memtree's own retrieval (its embedding model) when this page was written."
      : "for memtree's own retrieval by meaning, write the page with memtree show --query \"…\".";
    return "Typed searches match words (lexical BM25 in this page, which has no embedding model), not meanings; " + retrieved;
  }

  function runSearch(query) {
    for (const chip of document.querySelectorAll(".preset")) chip.classList.remove("active");
    if (!flat(query)) {
      showHits([]);
      info([searchNote()]);
      return;
    }
    const preset = presetFor(query);
    if (preset >= 0) {
      const chosen = DATA.queries[preset];
      document.querySelectorAll(".preset")[preset].classList.add("active");
      $("results-title").textContent = "Retrieved by memtree";
      showHits(chosen.hits);
      info([
        el("b", null, plural(chosen.hits.length, "node")),
        " retrieved by memtree's " + chosen.mode + " retrieval with its embedding model when this page was written.",
      ]);
      return;
    }
    const k = Number($("k").value) || DATA.k;
    const found = lexicalSearch(query, k);
    $("results-title").textContent = "Lexical matches";
    showHits(found);
    info(
      found.length
        ? [el("b", null, plural(found.length, "node")), " match the words of your query (lexical BM25 in this page; it finds words, not meanings)."]
        : ["No node contains these words (this page matches words, not meanings)."]
    );
  }

  // -- wiring -------------------------------------------------------------------

  function setUp() {
    document.title = DATA.title;
    $("title").textContent = DATA.title;
    const stats = DATA.stats;
    const summary = $("summary");
    const bits = [
      [String(stats.leaves), stats.leaves === 1 ? "leaf" : "leaves"],
      [String(stats.summaries), stats.summaries === 1 ? "summary" : "summaries"],
      [String(stats.depth), "levels deep"],
    ];
    for (const [number, word] of bits) {
      summary.append(el("b", null, number));
      summary.append(document.createTextNode(" " + word + " · "));
    }
    summary.append(document.createTextNode("namespace " + DATA.namespace + " · written " + DATA.generated));
    if (DATA.omitted) summary.append(document.createTextNode(" · " + DATA.omitted + " deeper nodes left out"));
    $("root-row").textContent = count ? "root · " + leafCount(nodes[0].leaves) : "root";

    const kChoice = $("k");
    for (const k of [...new Set([5, 10, 20, 50, DATA.k])].sort((a, b) => a - b)) {
      const option = el("option", null, String(k));
      option.value = String(k);
      option.selected = k === DATA.k;
      kChoice.append(option);
    }

    if (DATA.queries.length) {
      const presets = $("presets");
      presets.hidden = false;
      presets.append(el("span", null, "Retrieved by memtree:"));
      for (const preset of DATA.queries) {
        const chip = el("button", "preset", preset.query);
        chip.type = "button";
        chip.title = preset.query;
        chip.addEventListener("click", () => {
          $("search").value = preset.query;
          runSearch(preset.query);
        });
        presets.append(chip);
      }
    }

    const depthInput = $("depth");
    depthInput.value = String(Math.max(1, DATA.expand_depth));
    depthInput.max = String(Math.max(1, stats.depth));
    // "input", not "change": a change event fires again when the field loses focus,
    // and re-rendering then would swallow the click that took the focus away.
    depthInput.addEventListener("input", () => {
      if (depthInput.value !== "") openToDepth(Math.max(1, Number(depthInput.value) || 1));
    });
    $("expand-all").addEventListener("click", () => {
      depthInput.value = depthInput.max;
      openToDepth(Infinity);
    });
    $("collapse-all").addEventListener("click", () => {
      hitAncestors = new Set();
      depthInput.value = "1";
      openToDepth(1);
    });

    const search = $("search");
    let timer = 0;
    search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => runSearch(search.value), 180);
    });
    $("search-form").addEventListener("submit", (event) => {
      event.preventDefault();
      clearTimeout(timer);
      runSearch(search.value);
    });
    kChoice.addEventListener("change", () => runSearch(search.value));
    search.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        search.value = "";
        runSearch("");
      }
    });

    const tree = $("tree");
    tree.addEventListener("click", (event) => {
      const li = event.target.closest("li.node[data-index]");
      if (!li) return;
      const i = Number(li.dataset.index);
      if (event.target.closest(".caret")) setOpen(i, !expanded[i]);
      else select(i, true);
    });
    tree.addEventListener("dblclick", (event) => {
      const li = event.target.closest("li.node[data-index]");
      if (li && !event.target.closest(".caret")) setOpen(Number(li.dataset.index), !expanded[Number(li.dataset.index)]);
    });
    tree.addEventListener("keydown", onKey);

    for (let i = 0; i < count; i++) expanded[i] = !nodes[i].leaf && nodes[i].depth < DATA.expand_depth ? 1 : 0;
    render();
    if (DATA.queries.length) {
      search.value = DATA.queries[0].query;
      runSearch(DATA.queries[0].query);
    } else {
      runSearch("");
    }
  }

  function visibleRows() {
    return [...$("tree").querySelectorAll("li.node[data-index]")].filter((li) => li.offsetParent !== null);
  }

  function onKey(event) {
    if (selected < 0) return;
    const keys = { ArrowDown: 1, ArrowUp: -1 };
    if (event.key in keys) {
      const rows = visibleRows();
      const at = rows.indexOf(items[selected]);
      const next = rows[at + keys[event.key]];
      if (next) select(Number(next.dataset.index), true);
    } else if (event.key === "ArrowRight" || event.key === "Enter") {
      setOpen(selected, true);
    } else if (event.key === "ArrowLeft") {
      if (expanded[selected] && !nodes[selected].leaf) setOpen(selected, false);
      else if (nodes[selected].parent > 0) select(nodes[selected].parent, true);
    } else {
      return;
    }
    event.preventDefault();
  }

  setUp();
})();
