"""The suite's check of the documentation's code blocks: every
fenced shell and Python block in README.md, docs/ and examples/ is either run
(tests/integration/test_docs_commands.py) or marked with the reason it is not,
and every one has its timeshare flags and names checked
(tests/unit/test_docs_blocks.py). How to mark a block: markers.py."""
