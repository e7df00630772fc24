
(function () {
  var table = document.getElementById("all-trials");
  if (!table) return;
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  var box = document.getElementById("trial-filter"), count = document.getElementById("trial-count");
  var state = {col: -1, dir: 1, q: ""};
  function cell(row, col) { return row.cells[col].getAttribute("data-v"); }
  function apply() {
    var heads = table.tHead.rows[0].cells;
    if (state.col >= 0) {
      var numeric = heads[state.col].getAttribute("data-kind") === "num";
      rows.sort(function (a, b) {
        var x = cell(a, state.col), y = cell(b, state.col);
        if (x === "" || y === "") return (x === "") - (y === "");  /* blanks last, either way */
        var order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return order * state.dir || parseInt(cell(a, 0)) - parseInt(cell(b, 0));
      });
    }
    var words = state.q.toLowerCase().split(/\s+/).filter(Boolean), shown = 0;
    rows.forEach(function (row) {
      var text = row.textContent.toLowerCase();
      var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
      row.hidden = !keep; shown += keep ? 1 : 0; body.appendChild(row);
    });
    for (var i = 0; i < heads.length; i++) {
      heads[i].setAttribute("aria-sort", i === state.col ? (state.dir > 0 ? "ascending" : "descending") : "none");
    }
    count.textContent = shown + " of " + rows.length + " trials";
  }
  function save() {
    var parts = [];
    if (state.col >= 0) parts.push("sort=" + state.col + (state.dir < 0 ? "-" : ""));
    if (state.q) parts.push("q=" + encodeURIComponent(state.q));
    history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname);
  }
  /* The view is in the address (#sort=3-&q=errored), so that a link shows the same rows. */
  location.hash.replace(/^#/, "").split("&").forEach(function (part) {
    var kv = part.split("="), value = decodeURIComponent(kv[1] || "");
    if (kv[0] === "sort" && /^[0-9]+-?$/.test(value)) {
      state.col = parseInt(value); state.dir = value.slice(-1) === "-" ? -1 : 1;
    }
    if (kv[0] === "q") state.q = value;
  });
  box.value = state.q;
  table.tHead.addEventListener("click", function (event) {
    var th = event.target.closest("th");
    if (!th) return;
    var col = parseInt(th.getAttribute("data-col"));
    state.dir = col === state.col ? -state.dir : 1; state.col = col;
    apply(); save();
  });
  box.addEventListener("input", function () { state.q = box.value; apply(); save(); });
  apply();
})();
