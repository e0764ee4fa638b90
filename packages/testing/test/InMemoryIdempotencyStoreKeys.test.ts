/**
 * InMemoryIdempotencyStore promises the contract of the PostgreSQL store; here the same scenario
 * runs against it and against `PgIdempotencyStore` (on a throw-away schema), and their observable
 * results must be equal, for keys in particular.
 *
 * Failed before: the in-memory store named a key `${scope}\0${id}` without checking it, so two
 * distinct keys, ("s", "b\0c") and ("s\0b", "c"), were one (the second commit a false duplicate,
 * its effect never run), and keys PostgreSQL refuses (a NUL, a lone surrogate) were accepted where
 * `PgIdempotencyStore` fails with `IdempotencyError` `InvalidData`.
 */
import { assert, describe, layer } from "@effect/vitest"
import { IdempotencyStore } from "@jetworker/core"
import { Migrations, PgIdempotencyStore } from "@jetworker/sql-pg"
import { Data, Effect, Layer, Result } from "effect"
import { InMemoryIdempotencyStore, TestDatabase } from "../src/index.ts"

type Store = IdempotencyStore.IdempotencyStore["Service"]

class Boom extends Data.TaggedError("Boom")<{ readonly message: string }> {}

const PgLive = PgIdempotencyStore.layer().pipe(
  Layer.provideMerge(Layer.effectDiscard(Migrations.run)),
  Layer.provideMerge(TestDatabase.layer())
)

/** How an operation ended, in words. */
const show = (effect: Effect.Effect<unknown, unknown>) =>
  Effect.match(effect, {
    onFailure: (e) =>
      typeof e === "object" && e !== null && "_tag" in e
        ? `failed ${String((e as { _tag: string })._tag)}${"reason" in e ? ` ${String((e as { reason: string }).reason)}` : ""}`
        : `failed ${String(e)}`,
    onSuccess: (v) => (IdempotencyStore.isAlreadyCommitted(v) ? "AlreadyCommitted" : `Committed ${String(v)}`)
  })

const unique = () => crypto.randomUUID()

const paired = (scenario: (store: Store) => Effect.Effect<ReadonlyArray<string>, unknown>) =>
  Effect.gen(function*() {
    const pgStore = yield* IdempotencyStore.IdempotencyStore
    const memory = yield* scenario(InMemoryIdempotencyStore.make().service)
    const pg = yield* scenario(pgStore)
    return { memory, pg }
  })

const refused = "failed IdempotencyError InvalidData"

describe("InMemoryIdempotencyStore refuses and separates keys as PgIdempotencyStore does", () => {
  layer(PgLive, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("a key holding a NUL is refused (InvalidData) by commit, and never taken for another key", () =>
      Effect.gen(function*() {
        const { memory, pg } = yield* paired((store) =>
          Effect.gen(function*() {
            const s = `s${unique()}`
            // Two different keys: ("<s>", "b\0c") and ("<s>\0b", "c").
            return [
              yield* show(store.commit({ scope: s, id: "b\u0000c" }, Effect.succeed(1))),
              yield* show(store.commit({ scope: `${s}\u0000b`, id: "c" }, Effect.succeed(2)))
            ]
          }))
        assert.deepStrictEqual(pg, [refused, refused])
        assert.deepStrictEqual(memory, pg)
      }))

    it.effect("a key that is not well-formed Unicode (a lone surrogate) is refused with InvalidData by commit, commitAll, commitBatch and isCommitted", () =>
      Effect.gen(function*() {
        const { memory, pg } = yield* paired((store) =>
          Effect.gen(function*() {
            const s = `s${unique()}`
            return [
              yield* show(store.commit({ scope: s, id: "a\uD800" }, Effect.succeed(1))),
              yield* show(store.commitAll([{ scope: s, id: "ok" }, { scope: s, id: "b\uDC00" }], () => Effect.succeed(2))),
              yield* show(store.commitBatch([{ key: { scope: `${s}\uDC00`, id: "c" }, effect: Effect.succeed(3) }])),
              yield* show(store.isCommitted({ scope: s, id: "a\uD800" })),
              // Nothing of a refused commitAll was recorded.
              yield* show(store.isCommitted({ scope: s, id: "ok" }))
            ]
          }))
        assert.deepStrictEqual(pg, [refused, refused, refused, refused, "Committed false"])
        assert.deepStrictEqual(memory, pg)
      }))

    it.effect("the refusal names the operation, the part and where the bad character is", () =>
      Effect.gen(function*() {
        const store = InMemoryIdempotencyStore.make().service
        const nul = yield* Effect.flip(store.commit({ scope: "s", id: "b\u0000c" }, Effect.void))
        assert.match(nul.message, /^commit: the idempotency key's id "b\\u0000c" holds at index 1 a NUL/)
        const lone = yield* Effect.flip(store.isCommitted({ scope: "x\uD800", id: "c" }))
        assert.match(lone.message, /^isCommitted: the idempotency key's scope .* at index 1 not well-formed Unicode/)
      }))

    // Found sound before the fix; kept as they are cheap.
    it.effect("sound: an empty id and a very long id (100 000 chars) end the same way in both stores", () =>
      Effect.gen(function*() {
        const { memory, pg } = yield* paired((store) =>
          Effect.gen(function*() {
            const s = `s${unique()}`
            return [
              yield* show(store.commit({ scope: s, id: "" }, Effect.succeed("empty"))),
              yield* show(store.commit({ scope: s, id: "x".repeat(100_000) + unique() }, Effect.succeed("long")))
            ]
          }))
        assert.deepStrictEqual(memory, pg)
      }))

    it.effect("sound: Committed, then AlreadyCommitted (effect not run again)", () =>
      Effect.gen(function*() {
        const { memory, pg } = yield* paired((store) =>
          Effect.gen(function*() {
            const key = { scope: "keys", id: unique() }
            let runs = 0
            const effect = Effect.sync(() => ++runs)
            const a = yield* show(store.commit(key, effect))
            const b = yield* show(store.commit(key, effect))
            return [a, b, `runs ${runs}`, yield* show(store.isCommitted(key))]
          }))
        assert.deepStrictEqual(pg, ["Committed 1", "AlreadyCommitted", "runs 1", "Committed true"])
        assert.deepStrictEqual(memory, pg)
      }))

    it.effect("sound: commitBatch: per-element results, a key given twice runs once, a failed element alone rolled back", () =>
      Effect.gen(function*() {
        const { memory, pg } = yield* paired((store) =>
          Effect.gen(function*() {
            const [a, b, c] = [unique(), unique(), unique()].map((id) => ({ scope: "keys", id }))
            yield* store.commit(c!, Effect.void)
            const results = yield* store.commitBatch([
              { key: a!, effect: Effect.succeed("a") },
              { key: b!, effect: Effect.fail(new Boom({ message: "b" })) },
              { key: a!, effect: Effect.succeed("a again") },
              { key: b!, effect: Effect.succeed("b again") },
              { key: c!, effect: Effect.succeed("c") }
            ])
            const shown = results.map((r) =>
              Result.isFailure(r)
                ? `fail ${r.failure._tag}`
                : IdempotencyStore.isAlreadyCommitted(r.success)
                ? "AlreadyCommitted"
                : `ok ${String(r.success)}`
            )
            return [...shown, `a ${yield* store.isCommitted(a!)}`, `b ${yield* store.isCommitted(b!)}`]
          }))
        assert.deepStrictEqual(memory, pg)
      }))

    it.effect("sound: commitAll: all or nothing, duplicates given as AlreadyCommitted", () =>
      Effect.gen(function*() {
        const { memory, pg } = yield* paired((store) =>
          Effect.gen(function*() {
            const [a, b] = [unique(), unique()].map((id) => ({ scope: "keys", id }))
            const failed = yield* show(store.commitAll([a!, b!], () => Effect.fail(new Boom({ message: "all" }))))
            const none = `${yield* store.isCommitted(a!)} ${yield* store.isCommitted(b!)}`
            yield* store.commit(a!, Effect.void)
            let fresh: ReadonlyArray<number> = []
            const results = yield* store.commitAll([a!, b!, b!], (f) => Effect.sync(() => (fresh = f, "v")))
            return [failed, none, `fresh ${fresh.join(",")}`, ...results.map((r) => IdempotencyStore.isAlreadyCommitted(r) ? "Already" : String(r))]
          }))
        assert.deepStrictEqual(pg, ["failed Boom", "false false", "fresh 1", "Already", "v", "Already"])
        assert.deepStrictEqual(memory, pg)
      }))
  })
})
