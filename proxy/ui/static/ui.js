// Self-refresh for live pages: reload every data-refresh seconds while "live" is ticked.
// The choice is remembered per browser, so pausing survives the reloads.
(function () {
  const seconds = Number(document.body.dataset.refresh || 0);
  const box = document.getElementById("live");
  if (!seconds || !box) return;
  box.checked = localStorage.getItem("lego-live") !== "off";
  let timer = null;
  const arm = () => {
    clearTimeout(timer);
    if (box.checked) timer = setTimeout(() => location.reload(), seconds * 1000);
  };
  box.addEventListener("change", () => {
    localStorage.setItem("lego-live", box.checked ? "on" : "off");
    arm();
  });
  arm();
})();
