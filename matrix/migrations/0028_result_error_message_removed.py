from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('matrix', '0027_result_texts_to_blobs'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='result',
            name='error_message',
        ),
    ]
