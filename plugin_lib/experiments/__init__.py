"""One module per notebook: the code of a table, figure or study of the paper.

| notebook | module |
| --- | --- |
| 00 | ``dataset_statistics`` |
| 01-04 | ``main_tables`` |
| 05 | ``table5`` |
| 06 | ``base_quality`` |
| 07-08 | ``ablations`` |
| 09 | ``adidas`` |
| 10 | ``shift`` |
| 11 | ``table8`` |
| 12 | ``topk`` |
| 13 | ``theorem1`` |

Nothing in the library imports this package; it imports the layers below it.
"""
