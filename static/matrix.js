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

  // After htmx replaces an operator's rows, keep focus on its toggle.
  document.body.addEventListener("htmx:afterSwap", function (event) {
    var toggle = event.detail.target && document.querySelector("#" + event.detail.target.id + " .toggle");
    if (toggle && event.detail.target.id.indexOf("op-") === 0) toggle.focus();
  });
})();
