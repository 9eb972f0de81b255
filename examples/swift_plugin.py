"""ms-swift plugin file: makes ``--optimizer optcore`` available to ``swift sft``.

swift imports the files named by ``--external_plugins`` before it builds its
Trainer; this one registers optcore in ``swift.optimizers.optimizers_map``::

    swift sft --model ... --dataset ... \\
        --external_plugins examples/swift_plugin.py \\
        --optimizer optcore --optim_args "type=Lion,lr=3e-4,betas=(0.9, 0.99),weight_decay=0.1"

``--optim_args`` is the optcore optimizer config (``optcore list`` shows the
names; plugins such as ``optcore-lion`` add theirs). optcore's param groups
and the config's lr and weight decay apply; swift's ``--lr_scheduler_type``
and warm-up schedule it. Needs ``pip install ms-swift optcore``.
"""

from optcore.integrations import swift

swift.register()
