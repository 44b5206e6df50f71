// An async-iterable channel of generation events with a result promise.
import type { GenerationEvent, GenerationResult, GenerationStream } from "./types.ts";

/** Producer side of a GenerationStream. Events are buffered until the consumer reads them. */
export class EventChannel implements GenerationStream {
  #queue: GenerationEvent[] = [];
  #waiting: ((r: IteratorResult<GenerationEvent>) => void) | null = null;
  #done = false;
  #error: unknown = undefined;
  #resolve!: (r: GenerationResult) => void;
  #reject!: (e: unknown) => void;
  readonly result: Promise<GenerationResult>;

  constructor() {
    this.result = new Promise<GenerationResult>((res, rej) => {
      this.#resolve = res;
      this.#reject = rej;
    });
    // A consumer that only iterates must not see an unhandled rejection.
    this.result.catch(() => {});
  }

  push(e: GenerationEvent): void {
    if (this.#done) return;
    if (this.#waiting) {
      const w = this.#waiting;
      this.#waiting = null;
      w({ value: e, done: false });
    } else this.#queue.push(e);
  }

  finish(r: GenerationResult): void {
    if (this.#done) return;
    this.#done = true;
    this.#resolve(r);
    this.#wake();
  }

  fail(e: unknown): void {
    if (this.#done) return;
    this.#done = true;
    this.#error = e;
    this.#reject(e);
    this.#wake();
  }

  #wake(): void {
    if (this.#waiting && this.#queue.length === 0) {
      const w = this.#waiting;
      this.#waiting = null;
      if (this.#error !== undefined) w(Promise.reject(this.#error) as never);
      else w({ value: undefined, done: true });
    }
  }

  get closed(): boolean {
    return this.#done;
  }

  [Symbol.asyncIterator](): AsyncIterator<GenerationEvent> {
    return {
      next: (): Promise<IteratorResult<GenerationEvent>> => {
        const e = this.#queue.shift();
        if (e) return Promise.resolve({ value: e, done: false });
        if (this.#done) {
          if (this.#error !== undefined) return Promise.reject(this.#error);
          return Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((r) => {
          this.#waiting = r;
        });
      },
    };
  }
}
