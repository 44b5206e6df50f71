// The longest event-loop stall: a 1 ms interval timer records the largest gap between its ticks
// (a stall shows only when the timer fires after it, so let it tick once more before reading).

export interface StallProbe {
  /** The longest gap (ms) since the probe started or was last reset. */
  readonly max: number;
  /** Start a new measurement from now. */
  reset(): void;
  stop(): void;
}

export function stallProbe(): StallProbe {
  let last = performance.now();
  let max = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    max = Math.max(max, now - last);
    last = now;
  }, 1);
  return {
    get max() {
      return max;
    },
    reset() {
      max = 0;
      last = performance.now();
    },
    stop: () => clearInterval(timer),
  };
}
