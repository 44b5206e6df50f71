import net from "node:net";
import { guardedStream, streamGuardStats } from "../src/server/stream-guard.ts";
let produced = 0;
async function* frames() { for (let i = 0; i < 3000; i++) { produced++; yield "x".repeat(4096); if (i % 8 === 7) await Bun.sleep(1); } }
let aborted = 0;
const server = Bun.serve({ port: 0, hostname: "127.0.0.1", development: false, fetch(req, srv) {
  srv.timeout(req, 0);
  return new Response(guardedStream(frames(), { writeTimeoutMs: 1500, maxBufferedBytes: 32 * 1024, abort: () => aborted++, errorFrame: () => "data: error\n\n" }));
} });
const s = net.connect({ port: server.port, host: "127.0.0.1" }, () => s.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
s.pause();
s.on("error", () => {});
const t0 = performance.now();
s.on("close", () => console.log("closed", performance.now() - t0));
for (let i = 0; i < 8; i++) { await Bun.sleep(300); console.log(i, produced, aborted, streamGuardStats); }
process.exit(0);
