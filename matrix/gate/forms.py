"""Forms of the upgrade pages; validation only, the services decide."""

from __future__ import annotations

import json
from functools import cached_property

from django import forms

from matrix.models import Backend, DeviceType, Toolchain
from matrix.models.gate import Decision, Policy


class FocusesItsError:
    """A refused form puts focus on what is wrong: its first field with an
    error, or else its alert (``alert_autofocus``, for a refusal of the
    whole form). htmx focuses what it swaps in with ``autofocus``, and
    without it focus falls to the top of the page: the button that had it
    went with the form the answer replaced."""

    def add_error(self, field, error):
        super().add_error(field, error)
        first = next((name for name in self.fields if name in self.errors), None)
        for name, form_field in self.fields.items():
            if name == first:
                form_field.widget.attrs["autofocus"] = True
            else:
                form_field.widget.attrs.pop("autofocus", None)

    @property
    def alert_autofocus(self) -> bool:
        return not any(name in self.errors for name in self.fields)


class ToolchainChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, toolchain):
        # Named for what it is (TileLang, host, torch, driver) as on the
        # matrix, which marks the current toolchain so: the usual baseline.
        label = (
            f"{toolchain.name}: {toolchain.describe(self.hosts.get(toolchain.pk, ()))}"
        )
        return f"{label} (current)" if toolchain.is_current else label

    @cached_property
    def hosts(self) -> dict[int, list[str]]:
        from matrix.queries import toolchain_hosts

        return toolchain_hosts()


class ProposalForm(FocusesItsError, forms.Form):
    baseline = ToolchainChoiceField(queryset=Toolchain.objects.all())
    candidate = ToolchainChoiceField(queryset=Toolchain.objects.all())
    device_types = forms.ModelMultipleChoiceField(
        queryset=DeviceType.objects.all(), widget=forms.CheckboxSelectMultiple
    )
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)

    def clean(self):
        data = super().clean()
        if data.get("baseline") and data.get("baseline") == data.get("candidate"):
            raise forms.ValidationError("the candidate must differ from the baseline")
        return data


class DecisionForm(FocusesItsError, forms.Form):
    decision = forms.ChoiceField(
        choices=Decision.choices,
        widget=forms.RadioSelect,
        error_messages={"required": "choose approve or reject"},
    )
    comment = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        error_messages={"required": "write a comment: it explains the decision"},
    )
    # Asked for where a decision withdraws a live manifest (see the view).
    confirm = forms.BooleanField(required=False)


class ExceptionForm(FocusesItsError, forms.Form):
    backend = forms.ChoiceField(
        choices=Backend.choices, error_messages={"required": "choose a backend"}
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "write why its regressions may be waived"},
    )

    def __init__(self, *args, backends=None, **kwargs):
        super().__init__(*args, **kwargs)
        if backends is not None:
            self.fields["backend"].choices = [
                (value, label) for value, label in Backend.choices if value in backends
            ]


class JSONMapField(forms.CharField):
    """A JSON object edited as text."""

    def prepare_value(self, value):
        return value if isinstance(value, str) else json.dumps(value or {})

    def to_python(self, value):
        try:
            parsed = json.loads(value or "{}")
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc.msg}") from None
        if not isinstance(parsed, dict):
            raise forms.ValidationError("expected a JSON object")
        return parsed


class PolicyForm(forms.ModelForm):
    """The bounds are checked here, before the model's check constraints,
    whose messages name the constraint rather than the rule."""

    perf_budget = forms.FloatField(
        min_value=0,
        error_messages={"min_value": "must not be negative"},
        help_text=Policy._meta.get_field("perf_budget").help_text,
    )
    speed_budget = forms.FloatField(
        min_value=0,
        error_messages={"min_value": "must not be negative"},
        help_text=Policy._meta.get_field("speed_budget").help_text,
    )
    required_approvals = forms.IntegerField(
        min_value=1, error_messages={"min_value": "must be at least 1"}
    )
    perf_budgets = JSONMapField(
        required=False, help_text='per operator, e.g. {"gemm": 0.02}'
    )
    backend_owners = JSONMapField(
        required=False, help_text='per backend, user names: {"cuda": ["alice"]}'
    )

    class Meta:
        model = Policy
        fields = [
            "forbid_served_regressions",
            "require_candidate_results",
            "perf_budget",
            "perf_budgets",
            "speed_budget",
            "required_approvals",
            "reviewer_group",
            "rollout_group",
            "backend_owners",
            "note",
        ]
