import { assert, describe, it } from "@effect/vitest"
import { Cause } from "effect"
import { Migrator } from "effect/sql"
import { AuthorizationError, ConnectionError, SqlError, SqlSyntaxError } from "effect/sql/SqlError"
import { nextStep } from "../src/internal/nextStep.ts"

const props = { cause: new Error("from the driver"), message: "Query failed", operation: "execute" }
const sqlError = (reason: SqlError["reason"]) => new SqlError({ reason })

describe("the worker's next step for a start-up failure", () => {
  it("names DATABASE_URL for a database that cannot be reached", () => {
    assert.include(nextStep(Cause.fail(sqlError(new ConnectionError(props)))), "check DATABASE_URL")
  })

  it("a migration that failed on a missing privilege names the privilege, not the migration", () => {
    const error = new Migrator.MigrationError({
      kind: "Failed",
      message: `Migration "1_jetworker_dedup" failed`,
      cause: sqlError(new AuthorizationError(props))
    })
    assert.include(nextStep(Cause.fail(error)), "run the migrations as the owner ahead of time")
  })

  it("a migration that failed otherwise says that nothing was applied and what may be in the way", () => {
    const error = new Migrator.MigrationError({
      kind: "Failed",
      message: `Migration "1_jetworker_dedup" failed`,
      cause: sqlError(new SqlSyntaxError(props))
    })
    const step = nextStep(Cause.fail(error)) ?? ""
    assert.include(step, "none was applied")
    assert.include(step, "if a table of the same name already exists with other columns")
  })

  it("says that an interruption the worker did not cause came from inside the program", () => {
    assert.include(nextStep(Cause.interrupt(1)), "no stop signal")
  })

  it("says nothing where the error's own message says it", () => {
    assert.isUndefined(nextStep(Cause.fail(sqlError(new SqlSyntaxError(props)))))
    assert.isUndefined(nextStep(Cause.fail({ _tag: "NatsError", message: "no stream named ORDERS: declare it" })))
    assert.isUndefined(nextStep(Cause.die(new Error("boom"))))
    assert.isUndefined(nextStep(Cause.fail("a string")))
  })
})
