// Lint for the whole workspace (run from the root: `pnpm lint`).
import tseslint from "typescript-eslint"

export default tseslint.config(
  { ignores: ["**/node_modules/**", ".tools/**", ".tmp/**", "**/dist/**", "docs/api/**"] },
  ...tseslint.configs.recommended,
  {
    files: ["**/*.ts"],
    rules: {
      "@typescript-eslint/no-explicit-any": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/no-empty-object-type": "off",
      "@typescript-eslint/no-non-null-assertion": "off",
      "no-restricted-properties": ["error",
        { object: "it", property: "only", message: "no focused tests" },
        { object: "it", property: "skip", message: "no skipped tests" },
        { object: "describe", property: "only", message: "no focused tests" },
        { object: "describe", property: "skip", message: "no skipped tests" },
        { object: "test", property: "only", message: "no focused tests" },
        { object: "test", property: "skip", message: "no skipped tests" }
      ]
    }
  }
)
