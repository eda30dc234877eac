# Grain's "Reading ArrayRecord Files" tutorial, its code cells in order, copied from
# docs/tutorials/data_sources/arrayrecord_data_source_tutorial.md in google/grain (the
# jupytext twin of arrayrecord_data_source_tutorial.ipynb):
# https://github.com/google/grain/blob/859f62abe2457a402c510d8005a6a3570c67976c/docs/tutorials/data_sources/arrayrecord_data_source_tutorial.md
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
# - The `!pip install grain array_record` cell (an IPython magic) removed.
# - TFDS data (no network here) replaced by a local stand-in of the same shape, built in
#   this file: `import tensorflow_datasets as tfds` -> the `bool_q_train` function below
#   (records of TFDS's "bool_q": {"question": bytes, "answer": bool, "passage": bytes,
#   "title": bytes}, made from this project's real text corpus, shared/data), and
#   `tfds.data_source("bool_q", split="train")` -> `bool_q_train()`.
# - The pre-trained tokenizer the tutorial downloads replaced by a local one of the same
#   kind: `Tokenizer.from_pretrained("bert-base-cased")` -> `Tokenizer.from_file(...)` on
#   the BERT WordPiece tokenizer in this project's shared data (bert-base-uncased; its path
#   from CHUTE_SHARED_DATA).
# fmt: off

import pickle
import chute as grain
from array_record.python import array_record_module

import json
import os
import subprocess
import sys
import tempfile


# Stand-in for TFDS's "bool_q" train split: 1,100 records of the real text corpus that
# shared/data/make_corpus.py writes, shaped as bool_q's records.
def bool_q_train():
  shared = os.environ["CHUTE_SHARED_DATA"]
  corpus = os.path.join(tempfile.mkdtemp(), "corpus.jsonl")
  subprocess.run([sys.executable, os.path.join(shared, "make_corpus.py"), corpus, "1100"],
                 check=True, capture_output=True)
  records = []
  with open(corpus) as f:
    for line in f:
      record = json.loads(line)
      records.append({
          "question": f"is {record['title']} about {record['description']}".encode("utf-8"),
          "answer": record["label"] % 2 == 0,
          "passage": record["description"].encode("utf-8"),
          "title": record["title"].encode("utf-8"),
      })
  return records


# Load a public tensorflow dataset.
test_tfds = bool_q_train()

# Write the dataset into a test array_record file.
example_file_path = "./test.array_record"
writer = array_record_module.ArrayRecordWriter(
    example_file_path, "group_size:1"
)
record_count = 0
for record in test_tfds:
  writer.write(pickle.dumps(record))
  record_count += 1
writer.close()

print(
    f"Number of records written to array_record file {example_file_path} :"
    f" {record_count}"
)

# @title Load Data Source
example_array_record_data_source = (grain.sources.ArrayRecordDataSource(
    example_file_path
))
print(f"Number of records: {len(example_array_record_data_source)}")

print(example_array_record_data_source[0])

# Load a pre trained tokenizer
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file(os.path.join(os.environ["CHUTE_SHARED_DATA"], "bert-base-uncased.tokenizer.json"))

class ParseAndTokenizeText(grain.transforms.Map):
  """This function takes a serialized dict (as bytes), decodes it,

  applies a tokenizer to a specified feature within the dict,
  and returns the first 10 tokens from results.
  """

  def __init__(self, tokenizer, feature_name):
    self._tokenizer = tokenizer
    self._feature_name = feature_name

  def map(self, element: bytes) -> [str]:
    parsed_element = pickle.loads(element)
    # only pick the first 10 token IDs from the tokenized text for testing
    return self._tokenizer.encode(
        parsed_element[self._feature_name].decode('utf-8')
    ).tokens[:10]

# Example using Grain's MapDataset with ArrayRecord file source.
example_datasets = (
    grain.MapDataset.source(example_array_record_data_source)
    .shuffle(seed=42)
    .map(ParseAndTokenizeText(tokenizer, "question"))
    .batch(batch_size=10)
)

# Output a record at a random index
print(example_datasets[100])
