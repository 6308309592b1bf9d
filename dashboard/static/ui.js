// The dashboard's only script: live parts refresh themselves, destructive buttons
// ask first, and a header checkbox selects every row. Pages work without it.
"use strict";

function refresh(el) {
  const url = el.dataset.refresh;
  fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((html) => {
      // The server renders (and escapes) this fragment: it is our own markup.
      el.innerHTML = html;
      el.classList.remove("stale");
    })
    .catch(() => el.classList.add("stale"))
    .finally(() => setTimeout(() => refresh(el), 2000));
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach((el) => setTimeout(() => refresh(el), 2000));
  document.querySelectorAll("button[data-confirm]").forEach((b) =>
    b.addEventListener("click", (e) => {
      if (!window.confirm(b.dataset.confirm)) e.preventDefault();
    }));
  document.querySelectorAll("input[data-select-all]").forEach((all) =>
    all.addEventListener("change", () => {
      all.closest("table").querySelectorAll("tbody input[type=checkbox]").forEach((c) => { c.checked = all.checked; });
    }));
});
