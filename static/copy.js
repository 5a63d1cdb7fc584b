// "Copy" buttons: copy the text of the element named by data-copy. The
// Clipboard API exists only on https or localhost; elsewhere the text is
// selected and copied the older way.
document.addEventListener("click", function (event) {
  var button = event.target.closest("[data-copy]");
  if (!button) return;
  var source = document.querySelector(button.getAttribute("data-copy"));
  if (!source) return;
  var text = source.textContent.trim();
  function done(ok) {
    button.textContent = ok ? "Copied" : "Press Ctrl+C";
  }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(false); });
    return;
  }
  var range = document.createRange();
  range.selectNodeContents(source);
  var selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
  var ok = false;
  try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
  done(ok);
});
