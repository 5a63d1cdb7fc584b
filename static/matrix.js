// Arrow-key navigation between matrix cells. Cells are out of the tab order
// (a matrix can hold tens of thousands of links), so a keyboard user tabs to
// an operator toggle and moves from there with the arrows; Home/End jump to
// the row's ends.
(function () {
  "use strict";
  var MOVES = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };

  function navIn(cell) {
    return cell ? cell.querySelector("[data-nav]") : null;
  }

  function move(from, dr, dc, table) {
    var cell = from.closest("th, td");
    var rows = Array.prototype.filter.call(table.rows, function (r) {
      return r.querySelector("[data-nav]");
    });
    var r = rows.indexOf(cell.parentElement);
    var c = cell.cellIndex;
    for (;;) {
      r += dr;
      c += dc;
      if (r < 0 || r >= rows.length || c < 0 || c >= rows[r].cells.length) return null;
      var target = navIn(rows[r].cells[c]);
      if (target) return target;
      if (dr === 0 && dc === 0) return null;
    }
  }

  document.addEventListener("keydown", function (event) {
    var from = event.target.closest && event.target.closest("table.matrix [data-nav]");
    if (!from) return;
    var table = from.closest("table");
    var target = null;
    if (MOVES[event.key]) {
      target = move(from, MOVES[event.key][0], MOVES[event.key][1], table);
    } else if (event.key === "Home" || event.key === "End") {
      var cells = from.closest("tr").querySelectorAll("[data-nav]");
      target = event.key === "Home" ? cells[0] : cells[cells.length - 1];
    } else {
      return;
    }
    event.preventDefault();
    if (target) target.focus();
  });

  function operatorId(event) {
    var target = event.detail.target;
    return target && target.id && target.id.indexOf("op-") === 0 ? target.id : "";
  }

  // Rows an operator showed before its swap: "show more" keeps them and
  // appends, so the first new row is the one at this index.
  var shownBefore = {};
  document.body.addEventListener("htmx:beforeSwap", function (event) {
    var id = operatorId(event);
    if (id) shownBefore[id] = event.detail.target.querySelectorAll("tr.shape-row").length;
  });

  // After htmx replaces an operator's rows, the toggle keeps focus when it
  // was pressed; "show more" moves it to the first row it added, not back
  // to the toggle at the top of the list.
  document.body.addEventListener("htmx:afterSwap", function (event) {
    var id = operatorId(event);
    var body = id && document.getElementById(id);
    if (!body) return;
    var from = event.detail.requestConfig && event.detail.requestConfig.elt;
    if (from && from.classList.contains("toggle")) {
      body.querySelector(".toggle").focus();
      return;
    }
    var row = body.querySelectorAll("tr.shape-row")[shownBefore[id]];
    var first = row && row.querySelector("[data-nav]");
    if (first) first.focus();
  });
})();
