import { chromium } from "playwright-core";
const t0 = Date.now();
const b = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox","--disable-gpu","--disable-quic","--no-first-run","--disable-background-networking","--disable-component-update","--disable-sync"] });
const p = await b.newPage();
await p.setContent("<h1>hi</h1>");
console.log(await p.textContent("h1"), Date.now()-t0);
await b.close();
