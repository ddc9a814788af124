from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("sku", models.CharField(max_length=64)),
                ("quantity", models.PositiveIntegerField()),
                ("status", models.CharField(default="new", max_length=16)),
                ("task_id", models.CharField(blank=True, max_length=128)),
            ],
        ),
    ]
