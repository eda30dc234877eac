# Grain's "Reading Apache Parquet Files" tutorial, its code in order, copied from
# docs/tutorials/data_sources/parquet_dataset_tutorial.md in google/grain (the jupytext
# twin of parquet_dataset_tutorial.ipynb):
# https://github.com/google/grain/blob/18199c90567a99c7713b6211fdd1c83d08a54ef9/docs/tutorials/data_sources/parquet_dataset_tutorial.md
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
# - The `!pip install grain` cell (an IPython magic) removed.
# - The pre-trained tokenizer the tutorial downloads (no network here) replaced by a local
#   one of the same kind: `Tokenizer.from_pretrained("bert-base-cased")` ->
#   `Tokenizer.from_file(...)` on the BERT WordPiece tokenizer in this project's shared
#   data (bert-base-uncased; its path from CHUTE_SHARED_DATA), and `import os` for that.
# The document shows two blocks outside its notebook cells (a list of paths, and
# `ThreadPrefetchIterDataset`); they are kept, in place, as they are example code too.
# fmt: off

import pyarrow as pa
import pyarrow.parquet as pq

# Generate a sample PyArrow table containing email subjects and bodies.
table = pa.table({
    'email_subject': [
        "Meeting Reminder: Project X Update",
        "Important Announcement Regarding Company Policy",
        "FWD: Quick Question",
        "Your Order Confirmation #12345",
        "Invitation to Team Building Activity"
    ],
    'email_body': [
        "Hi team,\n\nJust a reminder about our Project X update meeting tomorrow at 10 AM PST. Please come prepared to discuss your progress and any roadblocks.\n\nSee you there,\n[Your Name]",
        "Dear employees,\n\nPlease be advised of a new company policy regarding remote work, effective May 1st, 2025. You can find the full details on the company intranet.\n\nRegards,\nManagement",
        "Hi [Name],\n\nForwarding you this email as you might have the answer to this quick question:\n\n[Original Email Content]",
        "Dear [Customer Name],\n\nThank you for your recent order! This email confirms your order #12345. You can view the details and track its shipment here: [Link]\n\nSincerely,\nThe [Company Name] Team",
        "Hello everyone,\n\nYou're invited to participate in our upcoming team building activity on Friday, April 28th. It will be a fun afternoon of [Activity]. Please RSVP by Wednesday.\n\nBest,\n[Organizer Name]"
    ]
})

# Write this table to a parquet file.
writer = pq.ParquetWriter('emails.parquet', table.schema)
writer.write_table(table)
writer.close()

import chute as grain
import pprint

ds = grain.experimental.ParquetIterDataset('./emails.parquet')

list(ds)[0]

ds = grain.experimental.ParquetIterDataset(
    './emails.parquet',
    memory_map=True,
)
list(ds)[0]

ds = grain.experimental.ParquetIterDataset(
    ['./emails.parquet', './emails.parquet'],
)

ds = grain.experimental.ThreadPrefetchIterDataset(
    ds,
    prefetch_buffer_size=10,
)

# Load a pre trained tokenizer.
import os
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(os.path.join(os.environ["CHUTE_SHARED_DATA"], "bert-base-uncased.tokenizer.json"))

class TokenizeText(grain.transforms.Map):
  """Tokenizes the text values within each element using a provided tokenizer."""
  def __init__(self, tokenizer):
    self._tokenizer = tokenizer

  def map(self, element):
    return [self._tokenizer.encode(item).tokens for item in element.values()]

# Tokenize the data using the provided tokenizer.
ds = ds.map(TokenizeText(tokenizer))

# Create an iterator object of the dataset.
ds_iter = iter(ds)
# Print the first element in the dataset.
pprint.pprint(next(ds_iter))
