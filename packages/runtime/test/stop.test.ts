import { describe, expect, test } from "vitest";
import { StopMatcher } from "../src/index.ts";

describe("stop strings", () => {
  test("text before the stop string is emitted, the stop string and after never", () => {
    const m = new StopMatcher(["END", "\n\n"]);
    const out: string[] = [];
    let stopped = false;
    for (const d of ["Hel", "lo E", "N", "D and more"]) {
      const r = m.push(d);
      out.push(r.text);
      if (r.stopped) {
        stopped = true;
        break;
      }
    }
    expect(stopped).toBe(true);
    expect(out.join("")).toBe("Hello ");
    expect(m.text).toBe("Hello ");
  });

  test("a held-back prefix that does not complete is released", () => {
    const m = new StopMatcher(["STOP"]);
    expect(m.push("a ST").text).toBe("a ");
    expect(m.push("x").text).toBe("STx");
    expect(m.push("ST").text).toBe("");
    expect(m.flush()).toBe("ST");
  });
});
