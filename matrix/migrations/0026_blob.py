import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('matrix', '0025_policy_rollout_group'),
    ]

    operations = [
        migrations.CreateModel(
            name='Blob',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('sha256', models.CharField(max_length=64, unique=True)),
                ('text', models.TextField()),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('sha256__regex', '^[0-9a-f]{64}$')), name='blob_sha256_hex')],
            },
        ),
        migrations.AddField(
            model_name='result',
            name='error',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='matrix.blob'),
        ),
        migrations.AddField(
            model_name='result',
            name='source',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='matrix.blob'),
        ),
        migrations.AlterField(
            model_name='result',
            name='details',
            field=models.JSONField(blank=True, default=dict, help_text='tolerance, target, timing samples, fingerprint components'),
        ),
    ]
