# Grain's README, the example of defining data processing steps ("Grain allows to define
# data processing steps in a simple declarative way"), copied from
# README.md in google/grain:
# https://github.com/google/grain/blob/05789c9924c9b967f5f61ac11a3b4766457e0678/README.md
#
# Copyright Google LLC (the Grain authors).
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Grain's code as it documents it (two-space indents and all), so this project's
# formatter, linter and type checker leave it alone:
# ruff: noqa
# mypy: ignore-errors
#
# Edits, and only these:
# - `import grain` -> `import chute as grain`.
# - `pass` added under the loop's `# Training step.` comment: the README's loop body is
#   that comment alone, which Python rejects; `pass` stands for the training step.
# fmt: off

import chute as grain

dataset = (
    grain.MapDataset.source([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    .shuffle(seed=42)  # Shuffles elements globally.
    .map(lambda x: x+1)  # Maps each element.
    .batch(batch_size=2)  # Batches consecutive elements.
)

for batch in dataset:
  # Training step.
  pass
