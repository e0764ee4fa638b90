/**
 * The packages as a user installs them (issue: installable packages): `scripts/packed-app.ts`
 * builds and packs every package, installs the tarballs into a scratch application outside the
 * workspace, compiles a consumer there with strict TypeScript (and checks the shipped declarations,
 * and that `<package>/package.json` resolves through `exports` while `internal/` does not), runs it against the real NATS and
 * PostgreSQL (one greeting committed, then a clean shutdown), and runs the installed
 * `jetworker --help`.
 */
import { assert, describe, layer } from "@effect/vitest"
import { DeadLetter, MaxDeliveries, NatsConnection } from "@jetworker/nats"
import { ChildWorker, TestDatabase } from "@jetworker/testing"
import { Effect, Layer, Redacted } from "effect"
import { fileURLToPath } from "node:url"
import { NatsLive, natsUrl } from "./support/services.ts"

const script = fileURLToPath(new URL("../scripts/packed-app.ts", import.meta.url))

describe("the packed packages", () => {
  layer(Layer.merge(TestDatabase.schema(), NatsLive), { excludeTestServices: true, timeout: "300 seconds" })((it) => {
    it.effect("a consumer built outside the workspace from the tarballs compiles with strict TypeScript, commits a message against the real services and shuts down cleanly; the installed jetworker answers --help", () =>
      Effect.gen(function*() {
        const schema = yield* TestDatabase.TestSchema
        const stream = `PACKED_${crypto.randomUUID().slice(0, 8).toUpperCase()}`
        const { manager } = yield* NatsConnection.NatsConnection
        // The consumer ("greeter", in the fixture) also creates its dead-letter and capture streams.
        yield* Effect.addFinalizer(() =>
          Effect.forEach(
            [stream, DeadLetter.destination(stream, "greeter").stream, MaxDeliveries.captureStream(stream, "greeter")],
            (name) => Effect.promise(() => manager.streams.delete(name).catch(() => false)),
            { discard: true }
          )
        )
        const child = yield* ChildWorker.spawn({
          script,
          env: {
            NATS_URL: natsUrl,
            DATABASE_URL: `${Redacted.value(schema.url)}?options=${encodeURIComponent(`-csearch_path=${schema.name}`)}`,
            APP_STREAM: stream
          }
        })
        const exit = yield* child.waitForExit("280 seconds")
        const output = (yield* child.lines).join("\n")
        assert.strictEqual(exit.code, 0, output)
        for (const step of ["build", "pack core", "pack cli", "contents jetworker-core-\\S+", "contents jetworker-cli-\\S+", "install", "compile", "check declarations", "resolve exports", "run", "jetworker --help"]) {
          assert.match(output, new RegExp(`^step ${step} ok`, "m"))
        }
        assert.include(output, `"message":"greeting Committed: from the tarballs"`)
        assert.match(output, /"message":"shutdown\.completed","result":"success"/)
        // What the getting-started guide has an application add (`--pack-only` prints the same).
        assert.match(output, /^to install these tarballs in an application/m)
        assert.match(output, /^overrides:\n {2}"@jetworker\/cli": "file:\/\S+jetworker-cli-\S+\.tgz"/m)
        assert.include(output, "SUBCOMMANDS")
        assert.include(output, "contract    Check, diff and apply")
      }).pipe(Effect.scoped), 300_000)
  })
})
