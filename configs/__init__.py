"""Named configs: `python train.py --config NAME` loads `configs/NAME.py:get_config()`."""
