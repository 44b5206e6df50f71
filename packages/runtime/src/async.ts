// Event-loop helpers of the runtime: yield a turn, and a FIFO lock that wakes its waiters (no polling).

/** Let I/O, timers and other requests' callbacks run before the next step. */
export function yieldToEventLoop(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}

/** A FIFO mutual-exclusion lock: `using _ = await lock.acquire()` holds it until the end of the block. */
export class Mutex {
  #held = false;
  #waiters: (() => void)[] = [];

  get locked(): boolean {
    return this.#held;
  }

  /** Resolves once the lock is this caller's; release it with the returned handle. */
  acquire(): Promise<Disposable> {
    const handle: Disposable = { [Symbol.dispose]: () => this.#release() };
    if (!this.#held) {
      this.#held = true;
      return Promise.resolve(handle);
    }
    return new Promise((resolve) => this.#waiters.push(() => resolve(handle)));
  }

  #release(): void {
    const next = this.#waiters.shift();
    // Hand the lock straight to the next waiter (it stays held), or free it.
    if (next) next();
    else this.#held = false;
  }
}
