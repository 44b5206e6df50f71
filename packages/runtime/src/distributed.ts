// Tensor-parallel generation across ranks (docs/distributed.md): rank 0 runs the ordinary Engine
// over a LeaderModel, which broadcasts every step's inputs through the group itself before running
// it; the other ranks run followSteps, which receives each step and runs the same forward on their
// shard. Broadcast = an all_sum to which only rank 0 contributes non-zeros, so every rank issues
// the same collectives in the same order, and rank 0's device-side decode tokens need no host read.
import { asyncEval, evaluate, MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Cache } from "@mlx-bun/kv-cache";
import type { Gemma4Model, KvMode, TensorParallel } from "@mlx-bun/models";

/**
 * The ops of the step protocol: one int32[9] header per step, [op, cache set, a, b, c, d, e, f, g]:
 * forward: a, b = B, L (then the ids [B, L] follow); makeCaches: a = maxKvSize (0: none),
 * b, c, d = the KV mode (kind 0 bf16 / 1 affine / 2 turbo, bits or kBits, group size or vBits),
 * e, f, g = the sliding layers' KV mode, coded alike (kind -1: none, the same as b, c, d).
 */
export const StepOp = { noop: 0, makeCaches: 1, forward: 2, freeCaches: 3, stop: 4 } as const;
const HEADER = 9;
/** Mode kind code of "no sliding mode of its own" (the sliding layers take the main mode). */
const SAME_MODE = -1;

function encodeMode(m: KvMode | undefined): [number, number, number] {
  if (!m || m.kind === "bf16") return [0, 0, 0];
  return m.kind === "affine" ? [1, m.bits, m.groupSize] : [2, m.kBits, m.vBits];
}

function encodeSlidingMode(m: KvMode | undefined): [number, number, number] {
  return m ? encodeMode(m) : [SAME_MODE, 0, 0];
}

function decodeMode(k: number, p: number, q: number): KvMode {
  if (k === 0) return { kind: "bf16" };
  if (k === 1) return { kind: "affine", bits: p, groupSize: q };
  if (k === 2) return { kind: "turbo", kBits: p, vBits: q };
  throw new MlxError(`followSteps: unknown KV mode code ${k} from rank 0`);
}

/** What the Engine needs of a model: Gemma4Model, or a LeaderModel that drives followers. */
export interface StepModel {
  makeCaches(mode?: KvMode, opts?: { maxKvSize?: number; slidingMode?: KvMode }): Cache[];
  forward(ids: MlxArray, caches: Cache[] | null): MlxArray;
}

function broadcastHeader(tp: TensorParallel, fields: number[]): void {
  using h = MlxArray.fromNumbers([...fields, ...new Array<number>(HEADER).fill(0)].slice(0, HEADER), [HEADER], "int32");
  using sum = mx.distributed.all_sum(h, { group: tp.group });
  asyncEval(sum);
}

/** Evaluate (asynchronously) the collectives a forward issued, so every rank runs all of them. */
function flushCollectives(tp: TensorParallel, also: MlxArray[] = []): void {
  const cs = tp.take();
  try {
    asyncEval(...also, ...cs);
  } finally {
    for (const c of cs) c.dispose();
  }
}

/**
 * Rank 0's model: each call is first broadcast to the followers (makeCaches, forward with the
 * token ids, cache release), then run locally. Caches it makes release their follower copies when
 * the first of them is disposed (the Engine disposes a request's caches together).
 */
export class LeaderModel implements StepModel {
  #nextSet = 1;
  #sets = new WeakMap<Cache, number>();
  #keepAlive: ReturnType<typeof setInterval> | undefined;
  #closed = false;

  constructor(
    readonly model: Gemma4Model,
    readonly tp: TensorParallel,
    opts: { keepAliveMs?: number } = {},
  ) {
    if (tp.rank !== 0) throw new MlxError(`LeaderModel runs on rank 0, this is rank ${tp.rank}`);
    // Followers wait in a collective for the next step; a no-op step now and then lets them heart-beat while idle.
    const every = opts.keepAliveMs ?? 1000;
    if (every > 0) {
      this.#keepAlive = setInterval(() => this.#send([StepOp.noop]), every);
      this.#keepAlive.unref?.();
    }
  }

  #send(fields: number[]): void {
    if (this.#closed) throw new MlxError("LeaderModel: the group was stopped");
    broadcastHeader(this.tp, fields);
  }

  makeCaches(mode?: KvMode, opts?: { maxKvSize?: number; slidingMode?: KvMode }): Cache[] {
    const set = this.#nextSet++;
    this.#send([StepOp.makeCaches, set, opts?.maxKvSize ?? 0, ...encodeMode(mode), ...encodeSlidingMode(opts?.slidingMode)]);
    const caches = this.model.makeCaches(mode, opts);
    if (caches.length === 0) return caches;
    const first = caches[0]!;
    this.#sets.set(first, set);
    const dispose = first.dispose.bind(first);
    let freed = false;
    first.dispose = () => {
      if (!freed && !this.#closed) this.#send([StepOp.freeCaches, set]);
      freed = true;
      dispose();
    };
    return caches;
  }

  forward(ids: MlxArray, caches: Cache[] | null): MlxArray {
    if (ids.ndim !== 2) throw new MlxError(`LeaderModel.forward: ids must be [B, L], got ${ids.describe()}`);
    const set = caches && caches.length ? this.#sets.get(caches[0]!) : 0;
    if (set === undefined)
      throw new MlxError("LeaderModel.forward: caches were not made by this LeaderModel (sharded generation supports the Engine's own caches only)");
    const [B, L] = ids.shape as [number, number];
    this.#send([StepOp.forward, set, B, L]);
    using i32 = mx.astype(ids, "int32");
    using shared = mx.distributed.all_sum(i32, { group: this.tp.group });
    const logits = this.model.forward(shared, caches);
    flushCollectives(this.tp, [shared]);
    return logits;
  }

  /** Tell the followers to exit their loop and wait until the message has gone out. */
  stop(): void {
    if (this.#closed) return;
    if (this.#keepAlive) clearInterval(this.#keepAlive);
    using h = MlxArray.fromNumbers([StepOp.stop, ...new Array<number>(HEADER - 1).fill(0)], [HEADER], "int32");
    using sum = mx.distributed.all_sum(h, { group: this.tp.group });
    this.#closed = true;
    evaluate(sum);
  }
}

export interface FollowOptions {
  /** Called after every received step (the launcher's heartbeat). */
  onStep?: (op: number) => void;
}

/**
 * A follower rank's loop: receive a step header, run the step on this rank's shard, until rank 0
 * sends stop. A lost peer makes the collective throw, which ends the loop with that error.
 */
export function followSteps(model: Gemma4Model, tp: TensorParallel, opts: FollowOptions = {}): void {
  if (tp.rank === 0) throw new MlxError("followSteps runs on ranks other than 0");
  const sets = new Map<number, Cache[]>();
  try {
    for (;;) {
      let header: number[];
      {
        using z = mx.zeros([HEADER], "int32");
        using h = mx.distributed.all_sum(z, { group: tp.group });
        header = h.tolist() as number[];
      }
      const [op, set, B, L] = header as [number, number, number, number];
      opts.onStep?.(op);
      if (op === StepOp.stop) return;
      if (op === StepOp.noop) continue;
      if (op === StepOp.makeCaches) {
        // For makeCaches the header's a..g are maxKvSize, the KV mode and the sliding layers' mode.
        const [maxKvSize, k, p, q, sk, sp, sq] = header.slice(2) as [number, number, number, number, number, number, number];
        sets.set(
          set,
          model.makeCaches(decodeMode(k, p, q), {
            ...(maxKvSize > 0 ? { maxKvSize } : {}),
            ...(sk !== SAME_MODE ? { slidingMode: decodeMode(sk, sp, sq) } : {}),
          }),
        );
      } else if (op === StepOp.freeCaches) {
        for (const c of sets.get(set) ?? []) c.dispose();
        sets.delete(set);
      } else if (op === StepOp.forward) {
        const caches = set === 0 ? null : sets.get(set);
        if (caches === undefined) throw new MlxError(`followSteps: rank 0 ran a forward on cache set ${set}, which this rank does not have`);
        using z = mx.zeros([B, L], "int32");
        using ids = mx.distributed.all_sum(z, { group: tp.group });
        using logits = model.forward(ids, caches);
        void logits;
        const cs = tp.take();
        try {
          evaluate(ids, ...cs);
        } finally {
          for (const c of cs) c.dispose();
        }
      } else throw new MlxError(`followSteps: unknown step op ${op} from rank 0`);
    }
  } finally {
    for (const cs of sets.values()) for (const c of cs) c.dispose();
  }
}

/** A process group (mx.distributed.Group), re-exported for the app. */
export type Group = mx.distributed.Group;
export type Backend = mx.distributed.Backend;

/**
 * Join the group the launcher configured (mx.distributed.init; strict: an error when it cannot
 * start). A single ring rank has no MLX_HOSTFILE (as mlx.launch): that is a size-1 group.
 */
export function joinGroup(backend: Backend, strict = !(backend !== "nccl" && !process.env.MLX_HOSTFILE)): Group {
  return mx.distributed.init({ strict, backend });
}

/** Whether this MLX build has the backend. */
export function backendAvailable(backend: Backend): boolean {
  return mx.distributed.is_available(backend);
}
