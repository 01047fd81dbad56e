// Iris dashboard: live refresh, log follow and the find box. Hand-written, no dependencies.
"use strict";

(function () {
  // --- Live region: re-fetch this page's fragment and swap it in. ---
  const live = document.getElementById("live");
  const status = document.getElementById("refresh-status");
  function scheduleRefresh(ms) {
    if (!live || !ms) return;
    setTimeout(refresh, ms);
  }
  async function refresh() {
    const ms = parseInt(live.dataset.refresh || "0", 10);
    if (!ms) return;
    if (document.hidden) { scheduleRefresh(ms); return; }
    try {
      const r = await fetch(location.href, { headers: { "x-iris-fragment": "1" }, cache: "no-store" });
      const html = await r.text();
      // Keep the focused link focused across the swap when it still exists.
      const focused = document.activeElement && live.contains(document.activeElement)
        ? document.activeElement.getAttribute("href") : null;
      live.innerHTML = html;
      if (focused) {
        const again = live.querySelector('a[href="' + CSS.escape(focused) + '"]');
        if (again) again.focus();
      }
      if (r.headers.get("x-iris-done") === "1") {
        live.dataset.refresh = "0";
        if (status) status.textContent = "Final state; no longer refreshing.";
        return;
      }
      if (status) status.textContent = "Updated " + new Date().toLocaleTimeString() + "; refreshes every " + (ms / 1000) + " s.";
    } catch (e) {
      if (status) status.textContent = "Refresh failed (" + e + "); retrying.";
    }
    scheduleRefresh(ms);
  }
  if (live) scheduleRefresh(parseInt(live.dataset.refresh || "0", 10));

  // --- Find box: searches only the lines loaded in the page. ---
  const find = document.getElementById("find");
  const count = document.getElementById("find-count");
  function applyFind() {
    if (!find) return;
    const q = find.value.toLowerCase();
    const items = document.querySelectorAll("#log-lines li");
    let hits = 0;
    items.forEach(function (li) {
      const match = q === "" || li.textContent.toLowerCase().indexOf(q) >= 0;
      li.hidden = !match;
      li.classList.toggle("hit", match && q !== "");
      if (match && q !== "") hits++;
    });
    if (count) {
      count.textContent = q === "" ? "" : hits + " of " + items.length + " loaded line(s) match";
    }
  }
  if (find) find.addEventListener("input", applyFind);

  // --- Log follow: poll for lines after the cursor and append them. ---
  const box = document.getElementById("log-box");
  const follow = document.getElementById("follow");
  const MAX_LINES = 5000;
  async function poll() {
    if (!box || !follow || !follow.checked) return;
    const list = document.getElementById("log-lines");
    const url = new URL(box.dataset.src, location.href);
    url.searchParams.set("after", box.dataset.cursor || "0");
    try {
      const r = await fetch(url, { headers: { "x-iris-fragment": "lines" }, cache: "no-store" });
      if (r.ok) {
        const html = await r.text();
        const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
        if (html) {
          list.insertAdjacentHTML("beforeend", html);
          const none = document.getElementById("no-lines");
          if (none) none.remove();
          while (list.children.length > MAX_LINES) list.firstElementChild.remove();
          applyFind();
          if (atBottom) box.scrollTop = box.scrollHeight;
        }
        box.dataset.cursor = r.headers.get("x-iris-cursor") || box.dataset.cursor;
        if (r.headers.get("x-iris-active") === "0") {
          follow.checked = false;
          return;
        }
      }
    } catch (e) { /* retry on the next tick */ }
    setTimeout(poll, 2000);
  }
  if (box) {
    box.scrollTop = box.scrollHeight;
    if (follow) {
      follow.addEventListener("change", function () { if (follow.checked) poll(); });
      if (follow.checked) setTimeout(poll, 2000);
    }
  }
})();
